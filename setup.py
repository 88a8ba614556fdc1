"""Package map: the three top-level folders become `folio.operator`, `folio.engine`, `folio.kernels`.

None of the folders has an `__init__.py` at its top: Python started at the repo root would import it as a
top-level `operator` (shadowing the standard library), `kernels` (a PyPI package that transformers probes)
or `engine`. So packages are listed here rather than discovered, and `folio.engine`'s package module, which
holds the offline API (`from folio.engine import LLM, SamplingParams`), lives in `engine/api.py` and is
installed as `folio/engine/__init__.py`. Editable installs must be strict (`make install` does that): their
link tree then carries the same rename, which the default editable finder cannot express.
"""

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

ROOTS = {"folio.operator": "operator", "folio.engine": "engine", "folio.kernels": "kernels"}
# package -> the module of its folder that is installed as the package's __init__
PACKAGE_MODULES = {"folio.engine": "api"}


def _packages() -> list[str]:
    found = []
    for name, folder in ROOTS.items():
        found.append(name)
        for sub in sorted(Path(folder).rglob("*")):
            if sub.is_dir() and sub.name != "__pycache__" and not sub.name.startswith("."):
                found.append(name + "." + ".".join(sub.relative_to(folder).parts))
    return found


class BuildPy(build_py):
    """Installs each PACKAGE_MODULES module as its package's `__init__.py`: in wheels, and (through
    `get_output_mapping`, which reads the same module list) in strict editable installs."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        modules = super().find_package_modules(package, package_dir)
        init = PACKAGE_MODULES.get(package)
        return [(pkg, "__init__" if module == init else module, path) for pkg, module, path in modules]


class BuildExt(build_ext):
    """Compiles the extensions side by side, one per core, unless `--parallel` says otherwise:
    decode_gemm_cpu.c alone takes 20 s at -O3, the three others 8 s together."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if self.parallel is None:
            self.parallel = True  # os.cpu_count() workers


# what every CPU kernel includes: scalar helpers, the vector layer (built for AVX-512 and AVX2), its width
# switch and the thread team
SIMD_HEADERS = [f"kernels/csrc/{name}" for name in ("cpu_vec.h", "cpu_simd.h", "cpu_simd_width.h", "cpu_team.h")]

# The CPU decode-attention kernel (kernels/csrc): plain C, no torch headers, so it builds in about a second.
# Optional: without a C compiler the engine falls back to its PyTorch attention path.
CPU_ATTENTION = Extension(
    "folio.kernels._cpu_attention",
    sources=["kernels/csrc/paged_decode_cpu.c"],
    depends=[*SIMD_HEADERS, "kernels/csrc/paged_decode_simd.h"],
    extra_compile_args=["-O3", "-fopenmp-simd", "-fno-math-errno", "-ffp-contract=fast", "-std=c11"],
    extra_link_args=["-pthread"],
    optional=True,
)

# The CPU prefill-attention kernel (kernels/csrc/prefill_attention_cpu.c), likewise optional: without it
# prompts run through SDPA.
CPU_PREFILL = Extension(
    "folio.kernels._cpu_prefill",
    sources=["kernels/csrc/prefill_attention_cpu.c"],
    depends=[*SIMD_HEADERS, "kernels/csrc/prefill_attention_simd.h"],
    extra_compile_args=["-O3", "-fno-math-errno", "-ffp-contract=fast", "-std=c11"],
    extra_link_args=["-pthread"],
    optional=True,
)

# The CPU decoder layer's fused elementwise ops: no contracted multiply-adds, so that their roundings are
# PyTorch's (kernels/csrc/fused_cpu.c).
CPU_FUSED = Extension(
    "folio.kernels._cpu_fused",
    sources=["kernels/csrc/fused_cpu.c"],
    depends=[*SIMD_HEADERS, "kernels/csrc/fused_cpu_simd.h"],
    extra_compile_args=["-O3", "-fopenmp-simd", "-fno-math-errno", "-ffp-contract=off", "-std=c11"],
    extra_link_args=["-pthread"],
    optional=True,
)

# The CPU projections of decode steps with few rows (kernels/csrc/decode_gemm_cpu.c), likewise optional:
# without it every projection runs oneDNN's GEMM.
CPU_DECODE_GEMM = Extension(
    "folio.kernels._cpu_decode_gemm",
    sources=["kernels/csrc/decode_gemm_cpu.c"],
    depends=SIMD_HEADERS,
    extra_compile_args=["-O3", "-fno-math-errno", "-std=c11"],
    extra_link_args=["-pthread"],
    optional=True,
)

# Batched multi-LoRA for the CPU's small steps (kernels/csrc/lora_cpu.c), likewise optional: without it the
# engine runs its PyTorch plans.
CPU_LORA = Extension(
    "folio.kernels._cpu_lora",
    sources=["kernels/csrc/lora_cpu.c"],
    depends=[*SIMD_HEADERS, "kernels/csrc/lora_cpu_simd.h"],
    extra_compile_args=["-O3", "-fno-math-errno", "-std=c11"],
    extra_link_args=["-pthread"],
    optional=True,
)

setup(
    cmdclass={"build_py": BuildPy, "build_ext": BuildExt},
    packages=_packages(),
    ext_modules=[CPU_ATTENTION, CPU_PREFILL, CPU_FUSED, CPU_DECODE_GEMM, CPU_LORA],
    package_dir=ROOTS,
    package_data={"": ["*.yaml", "*.json", "*.jinja", "*.lua"]},
)
