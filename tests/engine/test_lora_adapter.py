"""Loading peft adapters into the batched op's packed layout: the packed pairs reproduce peft's delta per
module on every family, and every unsupported adapter is refused with a message naming the problem."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from folio.engine.digest import compute_digest
from folio.engine.loader import load_model_config
from folio.engine.lora import LoRAError, LoRALayout, LoRARequest, load_adapter
from tests.support.lora import edit_adapter_config, make_adapter, peft_model
from tests.support.models import make_tiny_llama

FAMILIES = {
    "llama": {},
    "qwen3": {"head_dim": 16},
    "gemma3_text": {"head_dim": 16, "query_pre_attn_scalar": 16},
    "phi3": {},
}
MOE = {"arch": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
       "decoder_sparse_step": 2, "head_dim": 16}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory):
    cache: dict[str, Path] = {}

    def build(arch: str) -> Path:
        if arch not in cache:
            kwargs = MOE if arch == "qwen3_moe" else {"arch": arch, **FAMILIES[arch]}
            cache[arch] = make_tiny_llama(tmp_path_factory.mktemp(arch), **kwargs)
        return cache[arch]

    return build


@pytest.fixture(scope="module")
def llama_adapter(models, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_adapter(models("llama"), tmp_path_factory.mktemp("llama-r8"), r=8, seed=1)


def _config(model_dir: Path):
    return load_model_config(model_dir)[0]


def _copy(adapter: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(adapter, tmp_path / "adapter"))


def _peft_delta(peft, module: str, x: torch.Tensor) -> torch.Tensor:
    layer = peft.get_submodule("base_model.model." + module)
    with torch.no_grad():
        return layer(x) - layer.base_layer(x)


def _check_against_peft(model_dir: Path, adapter_dir: Path, max_rank: int, scaling: float) -> None:
    cfg = _config(model_dir)
    adapter = load_adapter(adapter_dir, cfg, max_rank=max_rank)
    layout = LoRALayout(cfg)
    saved = load_file(adapter_dir / "adapter_model.safetensors")
    peft = peft_model(model_dir, adapter_dir)
    assert adapter.modules and math.isclose(adapter.scaling, scaling)
    gen = torch.Generator().manual_seed(7)
    for module in adapter.modules:
        target = layout.modules[module]
        shape = layout.shapes[(target.layer, target.proj)]
        x = torch.randn(5, shape.in_features, generator=gen)
        pair = adapter.get(target.layer, target.proj)
        assert pair is not None
        assert pair.a.shape == (shape.n_slices * max_rank, shape.in_features)
        assert pair.b.shape == (shape.out_features, shape.n_slices * max_rank)
        got = (x @ pair.a.T @ pair.b.T)[:, target.rows[0]:target.rows[1]]
        a = saved[f"base_model.model.{module}.lora_A.weight"]
        b = saved[f"base_model.model.{module}.lora_B.weight"]
        manual = scaling * (x @ a.T) @ b.T
        assert manual.abs().max() > 0.01  # random non-zero A and B: a real delta
        torch.testing.assert_close(got, manual, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got, _peft_delta(peft, module, x), rtol=1e-5, atol=1e-5)
    # the whole projection's delta is each module's on its rows, zero on rows no module adapts
    for (layer, proj), pair in ((k, adapter.get(*k)) for k in layout.shapes):
        if pair is None:
            continue
        shape = layout.shapes[(layer, proj)]
        x = torch.randn(3, shape.in_features, generator=gen)
        want = torch.zeros(3, shape.out_features)
        for module in adapter.modules:
            t = layout.modules[module]
            if (t.layer, t.proj) == (layer, proj):
                a = saved[f"base_model.model.{module}.lora_A.weight"]
                b = saved[f"base_model.model.{module}.lora_B.weight"]
                want[:, t.rows[0]:t.rows[1]] = scaling * (x @ a.T) @ b.T
        torch.testing.assert_close(x @ pair.a.T @ pair.b.T, want, rtol=1e-5, atol=1e-5)
        # each rank block adds to its rows only: the CPU kernel skips the rest of its columns
        blocks = layout.blocks[(layer, proj)]
        per = pair.b.shape[1] // len(blocks)
        for j, (lo, hi) in enumerate(blocks):
            block = pair.b[:, j * per:(j + 1) * per]
            assert not block[:lo].any() and not block[hi:].any(), (layer, proj, j)


@pytest.mark.parametrize("r", [8, 64])
@pytest.mark.parametrize("arch", list(FAMILIES))
def test_packed_pairs_reproduce_peft(models, tmp_path: Path, arch: str, r: int) -> None:
    model_dir = models(arch)
    adapter = make_adapter(model_dir, tmp_path / "a", r=r, alpha=2 * r + 3, seed=r)
    _check_against_peft(model_dir, adapter, max_rank=64, scaling=(2 * r + 3) / r)


def test_rank_padding_and_rslora(models, tmp_path: Path) -> None:
    model_dir = models("llama")
    adapter_dir = make_adapter(model_dir, tmp_path / "a", r=8, alpha=16, use_rslora=True, seed=3)
    _check_against_peft(model_dir, adapter_dir, max_rank=32, scaling=16 / math.sqrt(8))
    adapter = load_adapter(adapter_dir, _config(model_dir), max_rank=32)
    qkv = adapter.get(0, "qkv")
    assert qkv is not None and qkv.a.shape[0] == 3 * 32
    for block in range(3):  # rank rows 8..32 of each slice's block are padding
        assert qkv.a[block * 32:block * 32 + 8].abs().sum() > 0
        assert not qkv.a[block * 32 + 8:(block + 1) * 32].any()
        assert not qkv.b[:, block * 32 + 8:(block + 1) * 32].any()
    q_rows = slice(0, 64)  # block-diagonal: q's rank columns write q's rows only
    assert not qkv.b[64:, 0:32].any() and qkv.b[q_rows, 0:8].abs().sum() > 0


def test_partial_targets_leave_the_rest_untouched(models, tmp_path: Path) -> None:
    model_dir = models("llama")
    adapter_dir = make_adapter(model_dir, tmp_path / "a", r=4, target_modules=["q_proj", "v_proj", "down_proj"],
                               layers_to_transform=[1], seed=5)
    _check_against_peft(model_dir, adapter_dir, max_rank=8, scaling=16 / 4)
    adapter = load_adapter(adapter_dir, _config(model_dir), max_rank=8, dtype=torch.bfloat16)
    assert adapter.layers[0] == {}
    assert set(adapter.layers[1]) == {"qkv", "down"}
    qkv = adapter.get(1, "qkv")
    assert qkv is not None and qkv.a.dtype == torch.bfloat16
    assert not qkv.a[8:16].any() and not qkv.b[64:96].any()  # k: not targeted
    assert adapter.size_bytes == sum(t.nbytes for w in adapter.layers[1].values() for t in (w.a, w.b))


def test_regex_target_modules(models, tmp_path: Path) -> None:
    model_dir = models("qwen3")
    adapter_dir = make_adapter(model_dir, tmp_path / "a", r=8, target_modules=r".*\.(k_proj|up_proj)", seed=6)
    _check_against_peft(model_dir, adapter_dir, max_rank=8, scaling=2.0)
    assert json.loads((adapter_dir / "adapter_config.json").read_text())["target_modules"] == r".*\.(k_proj|up_proj)"


def test_moe_attention_adapter_loads_and_expert_targets_are_refused(models, tmp_path: Path) -> None:
    model_dir = models("qwen3_moe")
    adapter_dir = make_adapter(model_dir, tmp_path / "a", r=8, target_modules=["q_proj", "o_proj"], seed=8)
    _check_against_peft(model_dir, adapter_dir, max_rank=8, scaling=2.0)
    cfg = _config(model_dir)
    layout = LoRALayout(cfg)
    assert (0, "gate_up") in layout.shapes and (1, "gate_up") not in layout.shapes  # layer 1 is sparse
    edit_adapter_config(adapter_dir, target_modules=["q_proj", "gate_proj"])
    with pytest.raises(LoRAError, match=r"target_modules: .*experts.*MoE experts is not supported"):
        load_adapter(adapter_dir, cfg, max_rank=8)
    edit_adapter_config(adapter_dir, target_modules=["gate"])
    with pytest.raises(LoRAError, match="MoE router is not supported"):
        load_adapter(adapter_dir, cfg, max_rank=8)
    edit_adapter_config(adapter_dir, target_modules=["q_proj"])
    tensors = load_file(adapter_dir / "adapter_model.safetensors")
    key = "base_model.model.model.layers.1.mlp.experts.0.gate_proj"
    tensors[key + ".lora_A.weight"] = torch.ones(8, 64)
    tensors[key + ".lora_B.weight"] = torch.ones(32, 8)
    save_file(tensors, adapter_dir / "adapter_model.safetensors")
    with pytest.raises(LoRAError, match=r"adapter_model.safetensors: model.layers.1.mlp.experts.0.gate_proj: LoRA on MoE experts"):
        load_adapter(adapter_dir, cfg, max_rank=8)


# --- refusals -------------------------------------------------------------------------------------------

CONFIG_REFUSALS = [
    ({"peft_type": "IA3"}, r"peft_type: 'IA3' is not supported"),
    ({"use_dora": True}, "use_dora: DoRA adapters are not supported"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save: .*not supported"),
    ({"bias": "all"}, "bias: 'all' is not supported"),
    ({"lora_bias": True}, "lora_bias"),
    ({"fan_in_fan_out": True}, "fan_in_fan_out"),
    ({"rank_pattern": {"q_proj": 4}}, "rank_pattern: .*per-module ranks"),
    ({"alpha_pattern": {"q_proj": 4}}, "alpha_pattern"),
    ({"target_parameters": ["mlp.experts.gate_up_proj"]}, "target_parameters"),
    ({"use_qalora": True}, "use_qalora: .*variant is not supported"),
    ({"r": 128}, r"r: rank 128 is above --max-lora-rank 64"),
    ({"r": 0}, "r: must be an integer >= 1"),
    ({"lora_alpha": "big"}, "lora_alpha: must be a number"),
    ({"target_modules": ["q_proj", "embed_tokens"]}, "model.embed_tokens: embedding and LM-head adapters"),
    ({"target_modules": ["lm_head"]}, "lm_head: embedding and LM-head adapters"),
    ({"target_modules": r".*(q_proj|lm_head)"}, "lm_head: embedding and LM-head adapters"),
    ({"target_modules": ["q_proj", "foo_proj"]}, r"target_modules: 'foo_proj' is not a module of LlamaForCausalLM"),
    ({"target_modules": "(("}, "not a valid regular expression"),
    ({"target_modules": ".*nothing"}, "matches no module"),
]


@pytest.mark.parametrize(("changes", "message"), CONFIG_REFUSALS)
def test_config_refusals(models, llama_adapter: Path, tmp_path: Path, changes: dict, message: str) -> None:
    adapter_dir = edit_adapter_config(_copy(llama_adapter, tmp_path), **changes)
    with pytest.raises(LoRAError, match=message) as err:
        load_adapter(adapter_dir, _config(models("llama")), max_rank=64)
    assert "adapter_config.json" in str(err.value) and "adapter 'adapter'" in str(err.value)


def test_file_refusals(models, llama_adapter: Path, tmp_path: Path) -> None:
    cfg = _config(models("llama"))
    with pytest.raises(LoRAError, match="is not a folder"):
        load_adapter(tmp_path / "nowhere", cfg, max_rank=64)
    adapter_dir = _copy(llama_adapter, tmp_path)
    (adapter_dir / "adapter_config.json").write_text("{not json")
    with pytest.raises(LoRAError, match=r"adapter_config\.json is not valid JSON"):
        load_adapter(adapter_dir, cfg, max_rank=64)
    (adapter_dir / "adapter_config.json").unlink()
    with pytest.raises(LoRAError, match=r"adapter_config\.json is missing"):
        load_adapter(adapter_dir, cfg, max_rank=64)
    shutil.copy(llama_adapter / "adapter_config.json", adapter_dir)
    weights = adapter_dir / "adapter_model.safetensors"
    weights.rename(adapter_dir / "adapter_model.bin")
    with pytest.raises(LoRAError, match=r"adapter_model\.bin is a pickle checkpoint; only adapter_model\.safetensors"):
        load_adapter(adapter_dir, cfg, max_rank=64)
    (adapter_dir / "adapter_model.bin").unlink()
    with pytest.raises(LoRAError, match=r"adapter_model\.safetensors is missing"):
        load_adapter(adapter_dir, cfg, max_rank=64)
    weights.write_bytes((llama_adapter / "adapter_model.safetensors").read_bytes()[:200])
    with pytest.raises(LoRAError, match=r"adapter_model\.safetensors is not a readable safetensors file"):
        load_adapter(adapter_dir, cfg, max_rank=64)


def test_tensor_refusals(models, llama_adapter: Path, tmp_path: Path) -> None:
    cfg = _config(models("llama"))
    adapter_dir = _copy(llama_adapter, tmp_path)
    file = adapter_dir / "adapter_model.safetensors"
    original = load_file(llama_adapter / "adapter_model.safetensors")
    prefix = "base_model.model.model.layers.0."

    def refused(tensors: dict[str, torch.Tensor], message: str) -> None:
        save_file(tensors, file)
        with pytest.raises(LoRAError, match=message):
            load_adapter(adapter_dir, cfg, max_rank=64)

    refused({**original, prefix + "self_attn.k_proj.lora_B.weight": torch.ones(33, 8)},
            r"model.layers.0.self_attn.k_proj.lora_B.weight has shape \(33, 8\), expected \(32, 8\)")
    refused({k: v for k, v in original.items() if k != prefix + "mlp.up_proj.lora_B.weight"},
            "model.layers.0.mlp.up_proj has no lora_B.weight")
    refused({**original, "base_model.model.model.layers.7.self_attn.q_proj.lora_A.weight": torch.ones(8, 64)},
            "model.layers.7.self_attn.q_proj is not a module of LlamaForCausalLM")
    refused({**original, "base_model.model.model.embed_tokens.lora_embedding_A": torch.ones(8, 512)},
            "embedding adapters are not supported")
    refused({**original, "base_model.model.lm_head.lora_A.weight": torch.ones(8, 64),
             "base_model.model.lm_head.lora_B.weight": torch.ones(512, 8)},
            "lm_head: embedding and LM-head adapters are not supported")
    refused({**original, prefix + "self_attn.q_proj.lora_magnitude_vector": torch.ones(64)},
            "DoRA magnitudes are not supported")
    refused({}, "holds no LoRA tensors")


def test_adapter_for_another_model_is_refused(models, tmp_path: Path) -> None:
    other = make_tiny_llama(tmp_path / "wide", hidden_size=96, num_attention_heads=6)
    adapter_dir = make_adapter(other, tmp_path / "a", r=8, target_modules=["o_proj"])
    with pytest.raises(LoRAError, match=r"o_proj.lora_A.weight has shape \(8, 96\), expected \(8, 64\)"):
        load_adapter(adapter_dir, _config(models("llama")), max_rank=64)


def test_digest_pins_the_folder(models, llama_adapter: Path, tmp_path: Path) -> None:
    cfg = _config(models("llama"))
    digest = compute_digest(llama_adapter)
    adapter = load_adapter(llama_adapter, cfg, max_rank=8, digest=digest, name="pinned")
    assert adapter.digest == digest and adapter.name == "pinned" and adapter.path == llama_adapter
    assert load_adapter(llama_adapter, cfg, max_rank=8).digest == digest  # computed when not pinned
    changed = _copy(llama_adapter, tmp_path)
    edit_adapter_config(changed, lora_alpha=17)
    with pytest.raises(LoRAError, match=f"do not match the pinned digest: expected {digest}"):
        load_adapter(changed, cfg, max_rank=8, digest=digest)
    with pytest.raises(LoRAError, match="malformed digest"):
        load_adapter(changed, cfg, max_rank=8, digest="sha256:abc")


def test_lora_request() -> None:
    req = LoRARequest("sql", 1, "/adapters/sql")
    assert req == LoRARequest(lora_name="sql", lora_int_id=1, lora_path="/adapters/sql")
    assert hash(req) == hash(LoRARequest("sql", 1, "/adapters/sql")) and req.digest is None
    with pytest.raises(AttributeError):
        req.lora_name = "x"  # type: ignore[misc]
    with pytest.deprecated_call():
        old = LoRARequest("sql", 1, lora_local_path="/adapters/sql")
    assert old == req and old.lora_local_path == "/adapters/sql"
    with pytest.deprecated_call():
        assert LoRARequest("sql", 1, "", "/adapters/sql") == req  # vLLM's positional order
    for bad in (0, -1, True):
        with pytest.raises(ValueError, match="lora_int_id must be an integer > 0"):
            LoRARequest("sql", bad, "/adapters/sql")
    with pytest.raises(ValueError, match="malformed digest"):
        LoRARequest("sql", 1, "/adapters/sql", digest="md5:1")
    pinned = LoRARequest("sql", 1, "/adapters/sql", digest="sha256:" + "0" * 64)
    assert pinned != req
