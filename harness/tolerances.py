"""Every numeric tolerance the harness uses, each with the reason it is what it is."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Tolerance:
    atol: float
    reason: str


TOLERANCES: dict[str, Tolerance] = {
    "eager_vs_exported": Tolerance(
        0.0,
        "torch.export records the same aten ops the eager wrapper runs, with the same weights and "
        "eager attention, so the in-memory program is bit-exact (torch.equal). With sdpa the fused "
        "kernel's reduction order differs between the two paths (~3e-7), which is why the harness "
        "loads every model with attn_implementation='eager'.",
    ),
    "pt2_reload": Tolerance(
        1e-5,
        "a .pt2 reloaded from disk is the same graph and the same weights, and prefill is bit-exact, "
        "but on torch 2.13 its decode-step logits differ from the in-memory program by up to 2e-6 "
        "(measured; cause not found yet, noted on the issue). 1e-5 is 5x that and 1e5x below any "
        "token margin.",
    ),
    "pte_vs_exported/fp32": Tolerance(
        1e-2,
        "XNNPACK's FP32 GEMM and its fused ops sum in another order with FMA: measured max |diff| "
        "2.4e-3 logits on the fixture; 4x headroom, still 800x below the fixture's 8-logit margins.",
    ),
    "pte_vs_exported/8da4w": Tolerance(
        0.5,
        "XNNPACK quantizes activations per token with its own rounding, so INT8 codes can differ by "
        "one step from torchao's reference: measured max |diff| 0.16 logits; 3x headroom, 16x below "
        "the fixture's 8-logit margins.",
    ),
    "pte_vs_exported/8da4w-fast": Tolerance(
        0.5,
        "as 8da4w (XNNPACK's per-token INT8 activation rounding against torchao's reference); the "
        "flash-attention kernel is the same in both: measured max |diff| 0.25 logits (8da4w: 0.21) "
        "on the fixture's prompts; 2x headroom, 16x below the fixture's 8-logit answer margins.",
    ),
    "native_vs_pte/fp32": Tolerance(
        0.0,
        "the native runner runs the same program with the same ExecuTorch kernels and XNNPACK build "
        "(the wheel's libraries) at the same thread count as the Python runtime: bit-exact, measured.",
    ),
    "native_vs_pte/8da4w": Tolerance(
        0.0,
        "as fp32: the same libraries at the same thread count, bit-exact, measured.",
    ),
    "native_vs_pte/8da4w-fast": Tolerance(
        5e-2,
        "the native runner's llama::custom_sdpa is the harness's own (plain softmax, not "
        "ExecuTorch's tiled flash attention), so attention outputs differ in summation order "
        "(~1e-6). The next linear quantizes its input to INT8 per token, which mostly absorbs that "
        "but can move one value across a rounding step: measured max |diff| 1.9e-6 on the fixture "
        "and 0.085 logits on the random benchmark model. 5e-2 covers the fixture 25000x and stays "
        "160x below its 8-logit answer margins; the benchmark tier checks the bench model against "
        "eager with pte_vs_exported/8da4w-fast.",
    ),
    "llamacpp_vs_eager/f32": Tolerance(
        5e-2,
        "llama.cpp's 'F32' is not FP32 end to end: its CPU GELU rounds its input to FP16 through a "
        "lookup table (GGML_GELU_FP16, compile time). Measured 3.2e-3 on the fixture; on the random "
        "benchmark model a 0.0103-logit near-tie flipped at position 41. Real disagreements (a lost "
        "softcap, a wrong KV layer) move logits by more than 0.1.",
    ),
    "logit_golden/fp32": Tolerance(
        1e-3,
        "log-probs of the golden top-5 across library builds: FP32 reassociation moves them by "
        "~1e-5, while a lost softcap or a shifted embedding scale moves them by more than 0.1.",
    ),
    "logit_golden/8da4w": Tolerance(
        2e-2,
        "a one-step change in an INT8 activation code (different rounding in a new torchao or "
        "XNNPACK) moves log-probs by up to ~1e-2; a scale or softcap regression moves them by >0.1.",
    ),
    "logit_golden/8da4w-fast": Tolerance(
        2e-2,
        "as 8da4w: a one-step change in an INT8 activation code moves log-probs by up to ~1e-2; a "
        "lost softcap, embedding scale or window moves them by >0.1.",
    ),
}


def tolerance(name: str) -> Tolerance:
    return TOLERANCES[name]
