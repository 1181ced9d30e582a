"""The emulator's inter-CTA ordering check (Module.launch(check_ordering=True)): a block that
reads what another block of the launch wrote passes only when the hand-over is ordered as the
GPU needs it (the writer's fence before its atomic, the reader's fence after its own, a plain
load, not the read-only path). Each broken step is planted in a small kernel and must fail,
naming both blocks; the correct hand-over must pass under every block order. A plain load is
enough because the reader's fence drops its SM's L1 lines: NVRTC's SASS shows it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from topkgen.build.render import template_dir
from topkgen.emulator import EmulationError, compile_source

KERNELS = Path(__file__).resolve().parents[1] / "support" / "kernels"
BLOCKS, THREADS = 6, 64


@pytest.fixture(scope="module")
def module():
    source = (template_dir() / "topk_memory.cuh").read_text() + (KERNELS / "ordering.cu").read_text()
    return compile_source(source, name="ordering")


def _run(module, variant: int, seed: int | None = None, check: bool = True):
    x = np.arange(BLOCKS * THREADS, dtype=np.int32)
    partial, ticket = np.full(BLOCKS, -1, np.int32), np.zeros(1, np.uint32)
    total, last = np.zeros(1, np.int32), np.full(1, -1, np.int32)
    module.launch("last_block_sum", BLOCKS, THREADS, [x, partial, ticket, total, last, np.int32(variant)],
                  schedule_seed=seed, check_ordering=check)
    return int(total[0]), int(last[0]), int(ticket[0]), int(x.sum())


def test_an_ordered_hand_over_passes_whichever_block_is_last(module):
    lasts = set()
    for seed in (None, *range(8)):
        total, last, ticket, expect = _run(module, 0, seed)
        assert (total, ticket) == (expect, 0), seed
        lasts.add(last)
    assert len(lasts) > 1, "the schedule seed must change the order the blocks run in"


@pytest.mark.parametrize("variant,why", [
    (1, "not released"),   # no fence between the store and the ticket
    (2, "not released"),   # the fence after the ticket
    (3, "not acquired"),   # the last block reads before fencing after its ticket
    (4, "load_global_nc"),  # the read-only path, not load_global
])
def test_each_broken_step_of_the_hand_over_fails_naming_both_blocks(module, variant, why):
    with pytest.raises(EmulationError, match=why) as caught:
        _run(module, variant, seed=3)
    message = str(caught.value)
    assert message.startswith("ordering: ") and message.count("block (") == 2, message
    assert "argument #1 (int32[6])" in message, message  # the buffer read, by name


def test_unchecked_launches_run_as_before(module):
    """Without the check the same kernels run on several workers; x86's ordering hides the
    planted bugs there, which is why the check exists."""
    for variant in range(5):
        total, _, ticket, expect = _run(module, variant, check=False)
        assert (total, ticket) == (expect, 0), variant


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_a_fence_drops_the_l1_lines_so_a_plain_load_after_it_reads_l2(arch):
    """What lets load_global (a plain ld.global) read another CTA's stores after the acquire:
    __threadfence() compiles to a GPU-scope barrier followed by CCTL.IVALL, which invalidates
    the SM's L1, so the loads after it miss there and read L2, where the stores are."""
    from topkgen.emulator.sass import nvrtc_cubin, sass_text

    source = (template_dir() / "topk_memory.cuh").read_text() + (KERNELS / "ordering.cu").read_text()
    unpredicated = [line.split(" ", 1)[1] if line.startswith("@") else line
                    for line in sass_text(nvrtc_cubin(source, "last_block_sum", arch))]
    lines = [line for line in unpredicated if line.split(".")[0].split(" ")[0] in ("MEMBAR", "CCTL", "LDG", "ATOMG")]
    fences = [i for i, line in enumerate(lines) if line.startswith("MEMBAR.SC.GPU")]
    assert fences, lines
    for i in fences:
        assert any(line.startswith("CCTL.IVALL") for line in lines[i + 1:i + 3]), lines
