"""The pure serving plan: `plan(isvc, spec, status, placement, endpoints) -> ServingPlan`.

plan      which revisions run, with how many replicas, from which weights (plan.py)
engine    the engine command line of a revision (`folio serve` flags)
router    the router config, from typed status and the ready endpoints
objects   a plan as Kubernetes objects (engines, router, budgets); cache: the weights PVC and pre-pull Jobs
"""
