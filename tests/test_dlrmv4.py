"""dlrmv4-mlperf: MLPerf Training DLRMv4's HSTU ranker at its published shapes, and the options of
gembench's blocks it is built from (no relative attention bias, position and time embeddings,
contextual tokens, target-aware candidate, user x item head), their FLOPs against FlopCounterMode,
and the reconciliation of its count with the reference's 315.7 GFLOP per example.

Runs use a shrunk copy of the shipped file (widths 32, 24 events: `small_copy`); the published
shapes themselves are checked from the config and the model built on the meta device."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gembench.errors import UsageError
from gembench.models.config import CONFIG_DIR, for_device, load_config
from gembench.models.cross import prepend_cls, prepend_tokens
from gembench.models.data import SyntheticData
from gembench.models.flops import batch_forward_flops, forward_flops_per_example, reconcile_flops
from gembench.models.gem import build_model
from gembench.models.heads import multitask_loss
from gembench.models.ops.pytorch.hstu_attention import hstu_jagged_attention, hstu_padded_attention

SHIPPED = CONFIG_DIR / "dlrmv4-mlperf.toml"
SHRINK = {  # line of the shipped file -> its line in the small copy
    "global_batch = 8192": "global_batch = 6",
    "dim = 512": "dim = 32",
    "heads = 4": "heads = 2",
    "max_len = 4087": "max_len = 24",
    "mean_len = 4087": "mean_len = 24",
    "position_buckets = 8192": "position_buckets = 16",
    "time_buckets = 2048": "time_buckets = 8",
    "input_mlp = [256]": "input_mlp = [16]",
    "item_mlp = [512, 512]": "item_mlp = [32, 32]",
    "mlp = [512]": "mlp = [32]",
    "cpu_rows_cap = 20000": "cpu_rows_cap = 500",
}


def small_copy(tmp_path, **extra: str) -> str:
    text = SHIPPED.read_text()
    for old, new in {**SHRINK, **extra}.items():
        assert old in text, f"the shipped dlrmv4-mlperf.toml has no line {old!r} any more"
        text = text.replace(old, new)
    path = tmp_path / "dlrmv4-small.toml"
    path.write_text(text)
    return str(path)


def test_published_shapes():
    cfg = load_config("dlrmv4-mlperf")
    h, (item, artist, album) = cfg.hstu, cfg.sequences
    assert (h.layers, h.heads, h.dim // h.heads, h.dim, h.rab, h.output) == (3, 4, 128, 512, False, "concat")
    assert (h.position_buckets, h.time_buckets, h.input_dropout, h.dropout) == (8192, 2048, 0.2, 0.1)
    assert h.alpha == pytest.approx(128**-0.5)
    # 8 contextual tokens + 4,086 history events + 1 candidate, within max_seq_len 4,096
    assert len(cfg.sparse.rows) + item.max_len == 4095 and item.max_len - 1 == 4086
    rows = [*cfg.sparse.rows, item.rows, artist.rows, album.rows]
    assert len(rows) == 11 and sum(rows) * 512 * 4 == pytest.approx(600e9, rel=0.01)  # ~600 GB of fp32 tables
    assert (artist.follows, album.follows, item.lengths) == ("item", "item", "fixed")
    with torch.device("meta"):
        model = build_model(cfg, device="meta")
    layer = model.sequence_arch["item"].layers[0]
    assert tuple(layer.uvqk.weight.shape) == (2048, 512) and tuple(layer.out_proj.weight.shape) == (512, 1536)
    assert layer.rab is None
    assert [m.out_features for m in model.item_arch if isinstance(m, torch.nn.Linear)] == [512, 512]
    assert model.item_arch[0].in_features == 1536  # item, artist and album of the candidate
    assert [m.out_features for m in model.over_arch.mlp if isinstance(m, torch.nn.Linear)] == [512, 1]
    assert tuple(model.contextual_arch.weight.shape) == (8, 512, 512)
    # on CPU every table, the sequences' too, is capped; the sequences keep their length
    capped = for_device(cfg, "cpu")
    assert max(capped.sparse.rows) == max(s.rows for s in capped.sequences) == 20000
    assert capped.sequences[0].max_len == 4087


def test_new_fields_at_their_defaults_keep_a_config_hash(tmp_path):
    """GEM's configs keep their hashes: every field added for DLRMv4 counts only when set."""
    tiny = (CONFIG_DIR / "tiny.toml").read_text()
    defaults = 'rab = true\nalpha = 0.0\ndropout = 0.0\noutput = "gated"\nposition_buckets = 0\ninput_mlp = []'
    text = tiny.replace("heads = 2\n", f"heads = 2\n{defaults}\n").replace(
        "mean_len = 16\n", 'mean_len = 16\nlengths = "lognormal"\nfollows = ""\n'
    )
    path = tmp_path / "tiny.toml"
    path.write_text(text)
    assert load_config(path).hash == load_config("tiny").hash
    path.write_text(text.replace("rab = true", "rab = false"))
    assert load_config(path).hash != load_config("tiny").hash


@pytest.mark.parametrize(
    "edit, message",
    [
        (("[candidate]", "[wukong]\nlayers = 1\nn_fm = 2\nn_lcb = 2\nrank = 2\nmlp = [8]\n\n[candidate]"), "'wukong'"),
        (('follows = "item"', 'follows = "nothing"'), "'sequences[1].follows' must name an earlier sequence"),
        (("item_mlp = [32, 32]", "item_mlp = [32, 16]"), "'candidate.item_mlp' must end at hstu.dim"),
        (('output = "concat"', 'output = "cat"'), "'hstu.output' must be one of gated, concat"),
    ],
)
def test_bad_fields_are_named(tmp_path, edit, message):
    path = small_copy(tmp_path)
    with open(path) as f:
        text = f.read()
    old, new = edit
    with open(path, "w") as f:
        f.write(text.replace(old, new, 1))
    with pytest.raises(UsageError, match=re.escape(message)):
        load_config(path)


def test_prepend_tokens_puts_k_tokens_in_front_and_prepend_cls_is_k_1():
    values = torch.arange(10.0).view(5, 2)
    offsets = torch.tensor([0, 2, 2, 5])  # an empty sequence in the middle
    tokens = -torch.arange(1.0, 13.0).view(3, 2, 2)
    out, new = prepend_tokens(values, offsets, tokens)
    expected = torch.cat([tokens[0], values[0:2], tokens[1], tokens[2], values[2:5]])
    assert torch.equal(out, expected) and new.tolist() == [0, 4, 6, 11]
    cls, cls_offsets = prepend_cls(values, offsets, tokens[:, 0])
    assert torch.equal(cls, torch.cat([tokens[0, :1], values[0:2], tokens[1, :1], tokens[2, :1], values[2:5]]))
    assert cls_offsets.tolist() == [0, 3, 4, 8]


def _no_bias_reference(q, k, v, offsets):
    out = torch.zeros_like(v)
    for b in range(offsets.numel() - 1):
        s, e = int(offsets[b]), int(offsets[b + 1])
        scores = torch.einsum("ihd,jhd->hij", q[s:e], k[s:e])
        a = torch.nn.functional.silu(scores).tril() / max(e - s, 1)
        out[s:e] = torch.einsum("hij,jhd->ihd", a, v[s:e])
    return out


@pytest.mark.parametrize("backend", ["tiled", "padded", "triton"])
def test_attention_without_a_bias(backend):
    """rab of shape (H, 0) is no bias on every backend (the Triton kernels compiled without it,
    run by Triton's interpreter here): outputs and gradients as the plain reference's."""
    from gembench.models.ops.triton import hstu_attention as triton_op

    if backend == "triton" and not (torch.cuda.is_available() or triton_op.interpreted()):
        pytest.skip("triton was imported compiled in this CPU process (tests/test_hstu_triton.py runs it fresh)")
    g = torch.Generator().manual_seed(0)
    lengths = [5, 1, 0, 19]
    offsets = torch.tensor([0, *lengths]).cumsum(0)
    q, k, v = (torch.randn(sum(lengths), 2, 16, generator=g).requires_grad_() for _ in range(3))
    rab = torch.zeros(2, 0)
    if backend == "tiled":
        out = hstu_jagged_attention(q, k, v, rab, offsets)
    elif backend == "padded":
        out = hstu_padded_attention(q, k, v, rab, offsets, max(lengths))
    else:
        out = triton_op.triton_hstu_attention(q, k, v, rab, offsets, max(lengths))
    grad = torch.randn(out.shape, generator=g)
    got = torch.autograd.grad(out, [q, k, v], grad)
    ref_out = _no_bias_reference(q, k, v, offsets)
    want = torch.autograd.grad(ref_out, [q, k, v], grad)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_blocks_flops_exact_against_the_counter(tmp_path):
    """Every block of the [candidate] layout (contextual tokens, SequenceInput, HSTU without a
    bias and with the concatenated output, item tower, user x item head): FlopCounterMode's count
    per block is its formula's, exactly; training about 3 x forward."""
    cfg = for_device(load_config(small_copy(tmp_path)), "cpu")
    torch.manual_seed(0)
    model = build_model(cfg)
    batch = SyntheticData(cfg, seed=0).batch(0)
    analytic = batch_forward_flops(cfg, batch)
    assert set(analytic) == {"contextual_arch", "sequence_input", "sequence_arch", "item_arch", "over_arch"}
    with FlopCounterMode(display=False) as forward:
        model(batch)
    counts = {name: sum(c.values()) for name, c in forward.get_flop_counts().items()}
    for block, flops in analytic.items():
        # a ModuleDict (one module per sequence) is never called itself: its entries are counted
        entries = [n for n in counts if n.startswith(f"GEM.{block}.") and n.count(".") == 2]
        assert counts.get(f"GEM.{block}", sum(counts[n] for n in entries)) == flops, block
    assert forward.get_total_flops() == sum(analytic.values())
    with FlopCounterMode(display=False) as train:
        multitask_loss(model(batch), batch.labels).backward()
    assert train.get_total_flops() == pytest.approx(3 * sum(analytic.values()), rel=0.02)
    # the candidate is the last event: its user vector reads the first history event's embedding
    first = [p for n, p in model.named_parameters() if "table_item" in n][0]
    assert first.grad is not None and first.grad.abs().sum() > 0


def test_flops_reconcile_with_the_published_315_7():
    r = reconcile_flops(load_config("dlrmv4-mlperf"))
    assert r["published_gflop"] == 315.7
    assert abs(r["residual_gflop"]) < 0.05  # the published figure's rounding
    reference = {name: theirs for name, _, theirs in r["rows"]}
    # the reference README's split: attention 180.4, UVQK 77.3, output projection 58.0
    assert [round(reference[k], 1) for k in ("attention", "uvqk", "output_projection")] == [180.4, 77.3, 58.0]
    # gembench's own count: 3 x forward, every block, on 4,095 real tokens
    assert r["steps"][0][1] == pytest.approx(sum(ours for _, ours, _ in r["rows"]))
    assert r["tokens"] == 4095


def test_capped_training_step_and_its_flops_per_example(tmp_path):
    """One step of the small copy on the optimized stack as `gembench run` prepares it (tables
    capped, fused embeddings, bf16; compile off to stay fast): a finite loss, the [candidate]
    layout's blocks, and the runner's model FLOPs per example (flops.model_per_step over
    run.global_batch) at 3 x the expected forward (every sequence max_len long, "fixed")."""
    from gembench.harness.metrics.mfu import train_flops
    from gembench.harness.train.measure import run_steps
    from gembench.harness.train.runconfig import RunConfig
    from gembench.harness.train.runner import build_state, prepare
    from gembench.harness.train.stack import STACKS
    from gembench.harness.train.work import described

    options = dataclasses.replace(STACKS["optimized"], compile=False)
    run = RunConfig(str(small_copy(tmp_path)), steps=1, warmup=0, device="cpu", peak_tflops=1.0)
    setup = prepare(run, [options])
    cfg = setup.workload.cfg  # the zoo's workload as it runs on the CPU
    assert max(cfg.sparse.rows) == 500  # capped on CPU
    assert setup.work.basis == "formula"  # the zoo's formula, checked against FlopCounterMode
    samples = run_steps(build_state(setup, options), setup.batches, 1, 0)
    assert torch.isfinite(torch.tensor(samples.loss)).all()
    variant = setup.variant(options)
    shape = described(variant, setup.work_of(options), setup.batches, 0, 1, options)
    blocks = shape["per_block"]
    assert set(blocks) == {"contextual_arch", "sequence_input", "sequence_arch", "item_arch", "over_arch"}
    assert shape["forward_flops"] == [pytest.approx(sum(blocks.values()))]
    per_example = train_flops(sum(blocks.values())) / cfg.data.global_batch
    assert per_example == pytest.approx(3 * sum(forward_flops_per_example(cfg).values()), rel=1e-9)


def test_checkpointed_hstu_layers_recompute_the_same_dropout(tmp_path):
    """DLRMv4's HSTU layers draw dropout masks: activation checkpointing must replay them, or the
    recomputed forward (and every gradient) is another one."""
    from gembench.harness.train.parallelize import apply_ac
    from gembench.models.zoo import ZooWorkload

    cfg = for_device(load_config(small_copy(tmp_path)), "cpu")
    batch = SyntheticData(cfg, seed=0).batch(0)
    grads = []
    for mode in ("none", "hstu"):
        torch.manual_seed(0)
        model = build_model(cfg)
        assert apply_ac(ZooWorkload(cfg), model, mode) == (0 if mode == "none" else cfg.hstu.layers)
        torch.manual_seed(1)
        multitask_loss(model(batch), batch.labels).backward()
        # (checkpoint_wrapper renames the parameters it wraps: compare them in order)
        grads.append([p.grad for n, p in model.named_parameters() if "uvqk" in n])
    assert len(grads[0]) == len(grads[1]) == 2 * cfg.hstu.layers
    for plain, recomputed in zip(*grads):
        torch.testing.assert_close(recomputed, plain)
