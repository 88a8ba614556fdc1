"""Each adapter's rollout: the base revisions' state machine per adapter, and what it says of the service."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from folio.operator.rollout import RevisionFacts, advance
from folio.operator.rollout.adapters import FITS, adapter_view, advance_adapters, fits, fold, set_fit
from folio.operator.rollout.types import AdapterObserved, Observed
from folio.operator.spec import (
    AnalysisSample,
    InferenceServiceSpec,
    InferenceServiceStatus,
    adapter_revision_name,
    engine_args,
    revision_name,
)
from tests.rollout.helpers import READY, T0, make_spec, sample


def with_adapters(spec: InferenceServiceSpec, *adapters: tuple[str, str], **rollout: Any) -> InferenceServiceSpec:
    """``spec`` serving adapters (name, tag): the tag determines the adapter revision's digest."""
    wire = spec.to_wire()
    wire["adapters"] = [
        {"name": name, "source": f"file:///adapters/{name}", "digest": "sha256:" + (tag.encode().hex() * 64)[:64],
         **({"rollout": rollout} if rollout else {})}
        for name, tag in adapters
    ]  # fmt: skip
    return InferenceServiceSpec.model_validate(wire)


class Service:
    """The service's rollout and its adapters', one pass at a time, as `run_pass` orders them."""

    def __init__(self, spec: InferenceServiceSpec) -> None:
        self.spec, self.now = spec, T0
        self.status = InferenceServiceStatus()
        self.facts: dict[str, RevisionFacts] = {revision_name(spec): READY}
        self.adapter_facts: dict[str, dict[str, RevisionFacts]] = {}
        self.events: list[str] = []

    def rev(self, name: str) -> str:
        return adapter_revision_name(next(a for a in self.spec.adapters if a.name == name))

    def tick(self, seconds: float = 0.0, analysis: dict[str, AnalysisSample] | None = None,
             overrides: frozenset[str] = frozenset()) -> None:
        self.now += timedelta(seconds=seconds)
        adapters = {name: AdapterObserved(dict(facts), (analysis or {}).get(name),
                                          overrides=frozenset(o for o, _, a in (x.partition("@") for x in overrides)
                                                              if a == name))
                    for name, facts in self.adapter_facts.items()}  # fmt: skip
        observed = Observed(now=self.now, revisions=dict(self.facts), adapters=adapters)
        d = advance(self.spec, 1, self.status, observed)
        a = advance_adapters(self.spec, 1, self.status, observed)
        d.status.adapters = a.adapters
        fold(self.status.conditions, d.status, generation=1, now=self.now)
        self.status = d.status
        self.events += [f"{e.reason}: {e.message}" for e in [*d.events, *a.events]]

    def weights(self, adapter: str) -> dict[str, int]:
        st = self.status.adapter(adapter)
        assert st is not None
        return {t.revision: t.weight for t in st.traffic}

    def condition(self, type_: str, adapter: str | None = None) -> tuple[str, str, str]:
        owner = self.status if adapter is None else self.status.adapter(adapter)
        assert owner is not None
        c = owner.condition(type_)
        assert c is not None
        return c.status, c.reason, c.message


def test_an_adapter_revision_is_named_by_its_pin_alone() -> None:
    spec = with_adapters(make_spec("a"), ("sql", "s1"))
    view = adapter_view(spec, spec.adapters[0])
    assert revision_name(view) == adapter_revision_name(spec.adapters[0])
    assert view.rollout.steps == spec.rollout.steps, "no rollout of its own: the service's"
    other = with_adapters(make_spec("b"), ("sql", "s1"))
    assert adapter_revision_name(other.adapters[0]) == adapter_revision_name(spec.adapters[0]), "not the base's"


def test_the_first_adapter_turns_lora_on_and_later_ones_keep_the_base_revision() -> None:
    base = make_spec("a")
    one, two = with_adapters(base, ("sql", "s1")), with_adapters(base, ("sql", "s2"), ("chat", "c1"))
    assert engine_args(one) == {"enableLora": True} and engine_args(base) == {}
    assert revision_name(one) != revision_name(base), "LoRA on is another command line"
    assert revision_name(one) == revision_name(two), "adding an adapter or changing one keeps the base revision"
    lora_on = InferenceServiceSpec.model_validate({**base.to_wire(), "engine": {"args": {"enableLora": True}}})
    assert revision_name(with_adapters(lora_on, ("sql", "s1"))) == revision_name(lora_on)


def test_an_adapter_is_served_once_every_replica_holds_it() -> None:
    svc = Service(with_adapters(make_spec("a"), ("sql", "s1")))
    sql = svc.rev("sql")
    svc.tick()
    assert svc.weights("sql") == {}
    assert svc.condition("WeightsReady")[:2] == ("False", "Pulling")
    assert "adapter sql: pre-pulling" in svc.condition("WeightsReady")[2]
    assert svc.condition("Ready")[:2] == ("True", "Serving"), "the base model serves meanwhile"
    svc.adapter_facts["sql"] = {sql: RevisionFacts("ready", ready_replicas=0)}
    svc.tick(1)
    assert svc.weights("sql") == {}, "verified, but no engine holds it yet"
    svc.adapter_facts["sql"] = {sql: READY}
    svc.tick(1)
    assert svc.weights("sql") == {sql: 100}
    assert svc.condition("Ready", "sql")[:2] == ("True", "Serving")
    assert svc.condition("WeightsReady")[0] == "True" and svc.condition("Degraded")[0] == "False"


def serving(*adapters: tuple[str, str], **rollout: Any) -> Service:
    svc = Service(with_adapters(make_spec("a"), *adapters, **rollout))
    svc.adapter_facts = {name: {svc.rev(name): READY} for name, _ in adapters}
    svc.tick()
    assert all(svc.weights(name) == {svc.rev(name): 100} for name, _ in adapters)
    return svc


def test_a_failing_adapter_canary_rolls_back_alone() -> None:
    svc = serving(("sql", "s1"), ("chat", "c1"))
    base, sql1, chat = revision_name(svc.spec), svc.rev("sql"), svc.rev("chat")
    svc.spec = with_adapters(make_spec("a"), ("sql", "s2"), ("chat", "c1"))
    sql2 = svc.rev("sql")
    assert revision_name(svc.spec) == base
    svc.tick()
    st = svc.status.adapter("sql")
    assert st is not None and st.canary_revision == sql2 and svc.weights("sql") == {sql1: 100}
    svc.adapter_facts["sql"][sql2] = READY
    svc.tick(1)
    assert svc.weights("sql") == {sql1: 90, sql2: 10}
    assert svc.condition("Progressing")[:2] == ("True", "CanaryStep")
    assert svc.condition("Progressing")[2].startswith("adapter sql: canary")
    figures = {"requests": 200, "errors": 40, "reasons": ["error rate 20.00% exceeds 1.00%"]}
    for _ in range(2):
        svc.tick(30, analysis={"sql": sample("Fail", svc.now + timedelta(seconds=30), **figures)})
    assert svc.weights("sql") == {sql1: 100}
    st = svc.status.adapter("sql")
    assert st is not None and [f.revision for f in st.failed_revisions] == [sql2]
    assert svc.condition("Degraded", "sql")[:2] == ("True", "AnalysisFailed")
    status, reason, message = svc.condition("Degraded")
    assert (status, reason) == ("True", "AnalysisFailed")
    assert message.startswith("adapter sql: ") and "error rate 20.00%" in message
    assert svc.weights("chat") == {chat: 100} and svc.condition("Degraded", "chat")[0] == "False"
    assert {t.revision: t.weight for t in svc.status.traffic} == {base: 100}, "the base model untouched"
    assert svc.condition("Ready")[:2] == ("True", "Serving")
    assert any(e.startswith("RolledBack: adapter sql: ") for e in svc.events)


def test_an_adapter_canary_is_promoted_on_its_own_steps_and_the_old_revision_drains() -> None:
    svc = serving(("sql", "s1"), steps=[{"weight": 50, "pause": "10s"}], drainPeriod="30s")
    sql1 = svc.rev("sql")
    svc.spec = with_adapters(make_spec("a"), ("sql", "s2"), steps=[{"weight": 50, "pause": "10s"}],
                             drainPeriod="30s")
    sql2 = svc.rev("sql")
    svc.adapter_facts["sql"][sql2] = READY
    svc.tick()
    assert svc.weights("sql") == {sql1: 50, sql2: 50}
    svc.tick(11, analysis={"sql": sample("Pass", svc.now + timedelta(seconds=11))})
    assert svc.weights("sql") == {sql2: 100}
    st = svc.status.adapter("sql")
    assert st is not None and {r.name: r.role for r in st.revisions} == {sql2: "Stable", sql1: "Retiring"}
    svc.tick(31)
    st = svc.status.adapter("sql")
    assert st is not None and [r.name for r in st.revisions] == [sql2]
    assert svc.condition("Progressing")[:2] == ("False", "RolloutComplete")


def test_promote_and_abort_act_on_one_adapter() -> None:
    svc = serving(("sql", "s1"), ("chat", "c1"))
    svc.spec = with_adapters(make_spec("a"), ("sql", "s2"), ("chat", "c2"))
    sql2, chat2 = svc.rev("sql"), svc.rev("chat")
    svc.adapter_facts["sql"][sql2] = svc.adapter_facts["chat"][chat2] = READY
    svc.tick()
    svc.tick(1, overrides=frozenset({"promote@sql", "abort@chat"}))
    assert svc.weights("sql") == {sql2: 100}
    st = svc.status.adapter("chat")
    assert st is not None and st.failed_revisions[-1].reason == "Aborted"
    assert {t.revision for t in svc.status.traffic} == {revision_name(svc.spec)}


def test_a_removed_adapter_leaves_status() -> None:
    svc = serving(("sql", "s1"), ("chat", "c1"))
    svc.spec = with_adapters(make_spec("a"), ("chat", "c1"))
    svc.tick(1)
    assert [a.name for a in svc.status.adapters] == ["chat"]


def test_an_adapter_whose_files_fail_is_reported_on_the_service() -> None:
    svc = Service(with_adapters(make_spec("a"), ("sql", "s1")))
    svc.adapter_facts["sql"] = {svc.rev("sql"): RevisionFacts("failed", "digest mismatch: sha256:00… != sha256:11…")}
    svc.tick()
    status, reason, message = svc.condition("WeightsReady")
    assert (status, reason) == ("False", "WeightsFailed") and message.startswith("adapter sql: ")
    assert "digest mismatch" in message
    assert svc.condition("Degraded")[:2] == ("True", "WeightsFailed")
    assert svc.condition("Ready")[:2] == ("True", "Serving")


def test_folded_conditions_keep_their_transition_time() -> None:
    svc = Service(with_adapters(make_spec("a"), ("sql", "s1")))
    svc.tick()
    first = svc.status.condition("WeightsReady")
    svc.tick(5)
    again = svc.status.condition("WeightsReady")
    assert first is not None and again is not None and first.status == again.status == "False"
    assert again.last_transition_time == first.last_transition_time


def test_more_adapter_revisions_than_an_engine_caches_is_a_warning_not_a_refusal() -> None:
    svc = serving(("sql", "s1"))
    assert fits(svc.spec, svc.status) == (FITS, "True", "Fits", "1 adapter revision(s) running; the engines keep 1 "
                                                                 "each in memory (maxCpuLoras) on 1 replica(s)")
    svc.spec = with_adapters(make_spec("a"), ("sql", "s2"))  # its canary makes two on every engine
    svc.tick()
    fit = fits(svc.spec, svc.status)
    assert fit is not None and fit[1:3] == ("False", "TooManyAdapters") and "2 adapter revisions run" in fit[3]
    before = list(svc.status.conditions)
    event = set_fit([], svc.spec, svc.status, generation=1, now=svc.now)
    assert event is not None and event.type == "Warning"
    assert set_fit(svc.status.conditions, svc.spec, svc.status, generation=1, now=svc.now) is None, "warned once"
    roomy = InferenceServiceSpec.model_validate({**svc.spec.to_wire(), "engine": {"args": {"maxCpuLoras": 4}}})
    assert fits(roomy, svc.status) is not None and fits(roomy, svc.status)[1] == "True"  # type: ignore[index]
    stable = svc.status.revision(svc.status.stable_revision)
    assert stable is not None
    stable.ready_replicas = 2  # two replicas keep one each: the routers send each adapter where it is held
    assert fits(svc.spec, svc.status)[1] == "True"  # type: ignore[index]
    assert fits(make_spec("a"), svc.status) is None
    set_fit(before, make_spec("a"), svc.status, generation=1, now=svc.now)
    assert svc.status.condition(FITS) is None, "no adapters, no condition"
