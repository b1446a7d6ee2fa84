"""Block sizes of the Triton kernels per card: what the dispatcher picks, and what CI compiles.

A configuration is (BLOCK_M rows, BLOCK_V vocabulary columns, BLOCK_K reduction step, warps,
pipeline stages). One tile size does not serve every card: the kernels hold an online softmax
over a [BLOCK_M, BLOCK_V] fp32 tile in registers, and a tile that fits an A100's 255 registers per
thread spills kilobytes on a T4 (whose Turing tensor cores take more registers per mma and have no
async copies to pipeline with). Each entry below was chosen as the largest tried tile that compiles
with no spill for that card and dtype (`python -m tinyrl.kernels.compile_check` prints them all;
tests/kernels/test_compile.py fails when one spills or overflows shared memory).

Under TRITON_INTERPRET (CPU tests) the kernels run on small tiles, `INTERPRETER_BLOCKS`: the math
of every configuration is the same code, checked against the torch reference there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Blocks:
    m: int
    v: int
    k: int
    warps: int
    stages: int = 3

    def label(self) -> str:
        return f"{self.m}x{self.v}x{self.k} w{self.warps} s{self.stages}"


INTERPRETER_BLOCKS = Blocks(16, 32, 16, 1, 1)
CAPABILITIES = (75, 80, 86, 89, 90)  # T4 | A100 | 3090, A10 | 4090, L4 | H100: the cards CI compiles for

# (kernel, dtype class) -> {lowest capability it serves: blocks}; a card takes the entry of the
# highest capability <= its own. "16" = bf16 and fp16 operands; "32" = fp32 (IEEE dots).
_LOGPROBS: dict[tuple[str, str], dict[int, Blocks]] = {
    ("logprobs_fwd", "16"): {75: Blocks(16, 64, 32, 4, 1), 80: Blocks(64, 128, 32, 8, 3)},
    ("logprobs_dz", "16"): {75: Blocks(32, 64, 32, 4, 1), 80: Blocks(64, 128, 32, 8, 3)},
    ("logprobs_fwd", "32"): {75: Blocks(64, 128, 32, 8, 1)},
    ("logprobs_dz", "32"): {75: Blocks(64, 128, 32, 8, 1)},
}
ADVANTAGE_WARPS = 4  # the grouped-advantage kernel's launch (Triton's default)
# Its fp64 [BLOCK_B, BLOCK_N] tiles: 32 groups x 256 rows spilled ~0.5 KB on an A100, 32 x 32 a few
# bytes on every card; 16 groups x up to 128 rows do not spill anywhere (groups beyond 16 loop).
ADVANTAGE_BLOCK_B = 16
ADVANTAGE_MAX_BLOCK_N = 128


def dtypes_for(capability: int) -> tuple[str, ...]:
    """The operand dtypes a card runs the kernels at: no bf16 below sm_80 (a T4 has none)."""
    return ("bf16", "fp16", "fp32") if capability >= 80 else ("fp16", "fp32")


def logprob_blocks(kernel: str, capability: int, dtype: str) -> Blocks:
    """The blocks of `kernel` ("logprobs_fwd" | "logprobs_dz") on sm_<capability> for `dtype` operands."""
    table = _LOGPROBS[(kernel, "32" if dtype in ("fp32", "float32") else "16")]
    return table[max([cc for cc in table if cc <= capability], default=min(table))]


def advantage_block_n(rows: int) -> int:
    """BLOCK_N of the grouped-advantage launch for `rows` rewards: a power of two, 16..ADVANTAGE_MAX_BLOCK_N."""
    return min(ADVANTAGE_MAX_BLOCK_N, max(16, 1 << (rows - 1).bit_length()))


def advantage_blocks() -> list[tuple[int, int]]:
    """Every (BLOCK_N, BLOCK_B) the grouped-advantage launch can pick (tinyrl.kernels.grouped_advantage)."""
    return sorted({(advantage_block_n(2 ** i), ADVANTAGE_BLOCK_B) for i in range(12)})
