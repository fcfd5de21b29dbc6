"""What a caller (or a test) can set about one compilation: every switch is a field here, and
every field is part of the artifact's cache key (``CompileOptions.key``), so changing one never
reuses a build made without it. The stages read these; nothing reads a module-level switch."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from smelt.target import Target, check_isa_choice

LAYOUT_MODES = ("nchw", "conv", "propagate", "global")
# winograd and dw_pw_fusion: on where the cost model says, off, or wherever legal (tests)
SWITCH_MODES = (True, False, "always")
WINOGRAD_ORDERS = ("auto", "banded", "phased")


@dataclass(frozen=True)
class CompileOptions:
    threads: int
    opt_level: int = 1
    allow_fallback: bool = True
    force_fallback: frozenset[str] = field(default_factory=frozenset)
    sanitize: bool = False
    # instrumented build: per-step timestamps in the native code (``smelt profile``); a separate
    # artifact and library, so the ordinary build carries no profiling code
    profile: bool = False
    # the integer kernels count the elements they saturate (``CompiledModel.saturation_counts``,
    # the numeric debug mode): off by default, since the counting was 4 of the ~10 vector ops of
    # an int8 conv's requantization; numeric_debug=True turns it on (another artifact and library)
    count_saturation: bool = False
    # layout planning (smelt.schedule.layout): "propagate" = NCHW[x]c convolutions with
    # transform elimination; "nchw", "conv" and "global" reproduce NeoCPU's Table 3 ablation
    layout: str = "propagate"
    # look up tuned schedules in the tuning database (smelt.schedule.db); off: defaults only
    use_tuning_db: bool = True
    # 3x3 stride-1 convs may run as Winograd F(2x2,3x3) (fp32 throughout; templates/winograd.py):
    # True where the cost model expects a win, "always" wherever legal, False never (the direct
    # kernels only: the direct sum's rounding)
    winograd: bool | str = True
    # Winograd's loop order: "auto" (the schedule stage's choice by L2 size), "banded", "phased"
    winograd_order: str = "auto"
    # a conv may write its output over a dead residual operand (codegen/inplace.py)
    inplace: bool = True
    # Concat inputs written straight into their slice of the output (codegen/concat_views.py)
    concat_views: bool = True
    # on a 16-lane target, convs whose channels only divide into 8-lane blocks run as the NCHW GEMM
    gemm_for_half_width: bool = True
    # GEMMs read a run-time B with unit column stride (1x1 conv input, MatMul B) in place, rows
    # ldb apart, instead of packing it: measured slower on ResNet-50's 1x1 layers (packed panels
    # stream better), so off; kept for A/B measurements and its tests
    gemm_read_b_in_place: bool = False
    # the widest ISA the generated code may use (``Target.narrowed``: "avx512", "avx2", "scalar");
    # None: the host's own. Like oneDNN's ONEDNN_MAX_CPU_ISA; SMELT_ISA sets it when not given
    isa: str | None = None
    # GEMMs read a run-time row-major A (MatMul's A, unit column stride) in place, the
    # micro-kernel broadcasting from MR rows lda apart, instead of packing MR-row panels
    gemm_read_a_in_place: bool = True
    # the GEMM micro-kernel prefetches its C tile (and a same-shape residual operand) before its
    # K loop, so they arrive while the FMAs run
    gemm_prefetch_c: bool = True
    # GEMMs with prepacked weights (B) prefetch the next B block of their loop nest into L2 while
    # the current one computes, a share of its lines per micro-kernel call: weights streaming
    # from DRAM (a transformer's, every call) otherwise stall each block's first row tile
    gemm_prefetch_next_b: bool = True
    # NCHWc direct convs software-prefetch the next input-channel block's first input row into
    # L1 at the start of each block (its lines would otherwise miss at every block start)
    conv_prefetch_input: bool = True
    # row-outer NCHWc direct convs whose input does not fit L2 software-prefetch into L2, while an
    # output row computes, the input rows the next output row adds (each tile its own columns of
    # them); "always": whatever the input's size (tests reach every edge with small shapes)
    conv_prefetch_rows: bool | str = True
    # NCHWc direct convs software-prefetch the weights they need next into L2 a few lines per
    # kernel tap (ic-outer order: a chunk ahead; row-outer order: the next output-channel tile)
    conv_prefetch_weights: bool = True
    # row-outer NCHWc convs whose weights fit half an L2 split their work by output rows first
    # (each thread reads its own band of the input, every thread all the L2-resident weights)
    conv_row_split: bool = True
    # a blocked conv whose input arrives plain with whole blocks of channels converts it to its
    # block first (a layout transform) instead of reading it as 1-channel blocks
    conv_block_plain_input: bool = True
    # row-outer NCHWc direct convs with too few work items for the threads (one row per image:
    # a lifted 1-D conv) cut each output row into column segments, each a work item
    conv_row_segments: bool = True
    # NCHWc direct convs whose output blocks are half the vector width (8 channels on AVX-512:
    # 24, 40, 72 output channels) put two output columns in each vector instead of running at
    # half width
    conv_column_pairs: bool = True
    # a blocked depthwise conv read only by a 1x1 conv runs fused with it, band by band of output
    # rows (schedule/dwpw.py): the depthwise output never goes to memory; "always": also where
    # its output fits L2 (tests reach every edge with small shapes)
    dw_pw_fusion: bool | str = True
    # ... and the 1x1 expand conv before such a pair too (MobileNet-v2's whole inverted-residual
    # block): its output rows go to a ring buffer as the bands need them
    expand_fusion: bool = True
    # a padded blocked int8 conv reads its producer's NCHW<b>c bytes in place and takes the
    # padding in the kernel (schedule/int_conv.py ``pad_in_kernel``); off: a zero-point-padded copy first
    int_conv_pad_in_kernel: bool = True
    # a blocked int8 conv prefetches the next output-channel group's weights into L2 while a
    # group runs (schedule/int_conv.py ``prefetch_next``); off: the hardware prefetchers alone
    int_conv_prefetch_weights: bool = True
    # 8-bit activations between blocked int8 convs whose channels the int8 block does not divide
    # (24 at AVX-512) are padded to it where no other op sees them (schedule/int_channel_pad.py):
    # blocked instead of plain; off: they stay plain
    int8_channel_padding: bool = True
    # 1-D conv networks run as 2-D ones of height 1 (passes/lift_1d.py): the blocked NCHWc
    # kernels and layout planning instead of the NCHW GEMM; 1-D ConvInteger/QLinearConv too
    # (passes/lift_1d_integer.py: the 2-D-only int conv templates); off: the 1-D graph as given
    lift_1d: bool = True
    # transposes sunk through element-wise ops and cancelled in pairs (passes/sink_transposes.py):
    # a TensorFlow-ported net's NHWC chains between NCHW convs become the convs' epilogues
    sink_transposes: bool = True
    # subnormal float32 weights of Conv/MatMul/Gemm/RNN nodes read as zero (passes/denormal_weights.py:
    # Intel cores take a microcode assist per multiply with one; PP-OCRv6's detector 210 -> 58 ms);
    # off: the weights as given
    flush_denormal_weights: bool = True
    # onnxruntime's dynamic quantization (MatMulInteger, Cast, the scale Mul, the bias Add) as one
    # MatMulIntegerToFloat (passes/matmul_integer_to_float.py); off: the four nodes as written
    matmul_integer_to_float: bool = True

    def __post_init__(self) -> None:
        if self.layout not in LAYOUT_MODES:
            raise ValueError(f"layout must be one of {', '.join(LAYOUT_MODES)} (given {self.layout!r})")
        for name in ("winograd", "dw_pw_fusion", "conv_prefetch_rows"):
            value = getattr(self, name)
            if value not in SWITCH_MODES or isinstance(value, int) and not isinstance(value, bool):
                raise ValueError(f"{name} must be True, False or 'always' (given {value!r})")
        if self.winograd_order not in WINOGRAD_ORDERS:
            raise ValueError(f"winograd_order must be one of {', '.join(WINOGRAD_ORDERS)} (given {self.winograd_order!r})")
        check_isa_choice(self.isa)

    def skipped_passes(self) -> frozenset[str]:
        """The optional passes these options switch off (``passes.pipeline.PASSES`` names)."""
        switches = {"lift_1d_convs": self.lift_1d, "lift_1d_integer_convs": self.lift_1d,
                    "sink_transposes": self.sink_transposes, "flush_denormal_weights": self.flush_denormal_weights,
                    "fuse_matmul_integer_to_float": self.matmul_integer_to_float}
        return frozenset(name for name, on in switches.items() if not on)

    def codegen_threads(self, target: Target) -> int:
        """Threads the generated code is sized for (per-thread scratch). It runs correctly with any
        pool of up to this many threads, so 1-thread and all-core runs share one library."""
        return max(self.threads, target.physical_cores)

    def key(self, target: Target) -> str:
        """Every field (``threads`` as the code is sized for it), for the artifact key."""
        fields = asdict(self)
        fields["threads"] = self.codegen_threads(target)
        fields["force_fallback"] = sorted(self.force_fallback)
        return json.dumps(fields, sort_keys=True)
