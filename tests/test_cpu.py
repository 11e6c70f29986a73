"""attnkit.cpu: /proc/cpuinfo parsed once for info, --bf16 and the benchmarks. Sample texts
stand in for other CPUs, so nothing here depends on the machine's own CPU."""

from __future__ import annotations

import pytest

from attnkit import cpu
from attnkit.train.loop import precision

ZEN = """processor\t: 0
model name\t: AMD EPYC
flags\t\t: fpu avx2 avx512f avx512_bf16

processor\t: 1
model name\t: other
flags\t\t: fpu
"""
XEON = "processor\t: 0\nmodel name\t: Intel Xeon\nflags\t\t: fpu avx2 avx512f avx512_vnni\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd sve bf16\n"


def test_first_processor_fields_only():
    fields = cpu.parse_cpuinfo(ZEN)
    assert fields["model name"] == "AMD EPYC"
    assert cpu.cpu_flags(fields) == {"fpu", "avx2", "avx512f", "avx512_bf16"}


@pytest.mark.parametrize(
    ("text", "want"), [(ZEN, True), (XEON, False), (ARM, True), ("", None), ("model: x\n", None)]
)
def test_native_bf16_from_the_flags(text, want):
    assert cpu.native_bf16(cpu.cpu_flags(cpu.parse_cpuinfo(text))) is want


def test_this_machine_is_read_consistently():
    flags = cpu.cpu_flags()
    assert cpu.native_bf16() == (any(f in flags for f in cpu.BF16_FLAGS) if flags else None)


@pytest.mark.parametrize("answer", [False, None])
def test_bf16_training_refused_without_native_bf16(monkeypatch, answer):
    monkeypatch.setattr(precision, "native_bf16", lambda: answer)
    with pytest.raises(ValueError, match=r"^bf16: this CPU has no native bfloat16"):
        precision.require_native_bf16()
    monkeypatch.setattr(precision, "native_bf16", lambda: True)
    precision.require_native_bf16()  # no error
