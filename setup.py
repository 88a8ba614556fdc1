"""Package map: the three top-level folders become `folio.operator`, `folio.engine`, `folio.kernels`.

`operator/` has no `__init__.py` at its top (a regular package named `operator` on the repo root
would shadow the standard library), so packages are listed here rather than discovered.
"""

from pathlib import Path

from setuptools import Extension, setup

ROOTS = {"folio.operator": "operator", "folio.engine": "engine", "folio.kernels": "kernels"}


def _packages() -> list[str]:
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        for sub in sorted(Path(folder).rglob("*")):
            if sub.is_dir() and sub.name != "__pycache__" and not sub.name.startswith("."):
                found.append(name + "." + ".".join(sub.relative_to(folder).parts))
    return found


# The CPU decode-attention kernel (kernels/csrc): plain C, no torch headers, so it builds in about a second.
# Optional: without a C compiler the engine falls back to its PyTorch attention path.
CPU_ATTENTION = Extension(
    "folio.kernels._cpu_attention",
    sources=["kernels/csrc/paged_decode_cpu.c"],
    extra_compile_args=["-O3", "-fopenmp-simd", "-fno-math-errno", "-ffp-contract=fast", "-std=c11"],
    extra_link_args=["-pthread"],
    optional=True,
)

setup(
    packages=_packages(),
    ext_modules=[CPU_ATTENTION],
    package_dir=ROOTS,
    package_data={"": ["*.yaml", "*.json", "*.jinja", "*.lua"]},
)
