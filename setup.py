"""Package map: the three top-level folders become `folio.operator`, `folio.engine`, `folio.kernels`.

`operator/` has no `__init__.py` at its top (a regular package named `operator` on the repo root
would shadow the standard library), so packages are listed here rather than discovered.
"""

from pathlib import Path

from setuptools import setup

ROOTS = {"folio.operator": "operator", "folio.engine": "engine", "folio.kernels": "kernels"}


def _packages() -> list[str]:
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        for sub in sorted(Path(folder).rglob("*")):
            if sub.is_dir() and sub.name != "__pycache__" and not sub.name.startswith("."):
                found.append(name + "." + ".".join(sub.relative_to(folder).parts))
    return found


setup(
    packages=_packages(),
    package_dir=ROOTS,
    package_data={"": ["*.yaml", "*.json", "*.jinja", "*.lua"]},
)
