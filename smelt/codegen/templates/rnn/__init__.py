"""Recurrent templates: ONNX LSTM, GRU and RNN (float32), every attribute and input.

Template ``rnn_native``, a DeepCPU-style schedule (Zhang et al., "DeepCPU: Serving RNN-based
Deep Learning Models 10x Faster", USENIX ATC 2018):

* **MM-DAG phase 1, hoisting.** The input projection X·W^T (+ both biases, where the gate
  equations allow merging them) of every time step and every direction is one GEMM before the
  recurrence, into scratch ``XW[T*B][D*G*Hp]``. All gates of all directions are *fused* into
  one weight matrix, re-laid out at compile time into 64-column panels ``[K][64]`` so the
  micro-kernel (6 rows x 4 vectors of 16) streams it; threads split (panel, row-block) tasks
  panel-major, so each thread keeps its own panels in L2.
* **Recurrence, fused gates.** ``R`` is packed per direction and per block of 16 hidden units
  as ``[H][G*16]``: the G gate pre-activations of 16 hidden units (x a tile of batch rows) are
  accumulated in registers as ``XW[t] + h_{t-1}·R^T`` by a non-inlined tile kernel
  (``_dot_code``), then the gate math (vectorized sigmoid / tanh / ...) runs per row and block.
  Batch rows are cut into balanced chunks of up to 6 (LSTM) / 8 rows; the K loop is blocked so
  all chunks of a row group reuse an L1 block of R (at H=1024 otherwise re-read from L3). When
  R exceeds L2 (H=1024: re-read from L3 every step), odd steps walk the hidden blocks in reverse,
  so each step starts on the ~2 MB the previous one left in L2 (batch 1: 17-29% faster).
* **Gate split** (R streamed from L3 and a thread's rows between one tile and
  ``GATE_SPLIT_ROWS``, e.g. H=1024 B=10): R is packed gate-major per hidden block
  (``[g][H][16]``, ``RnnConfig.rgm``) and the cell computes all of the thread's rows in one
  tile, over the gates in passes (10 rows x 2 gates), each pass one contiguous stream of R that
  every row consumes as it arrives. Row chunks instead read each K block from L3 in one chunk
  and from L1 in the others, so the L3 stream stalled the first chunk and idled during the rest
  (no overlap: step time ~ stream + compute). A/B in one process, medians of 30 calls:
  recurrence LSTM E1024 H1024 B10 43.0 -> 38.0 ms, GRU 32.1 -> 28.9 ms (whole model 1.075x /
  1.062x). Not at 20 rows (20 rows x 1 gate: 21 loads per 20 FMAs, no faster than chunks in a
  microbenchmark), nor with R's interleaved [H][G*16] layout (no faster either).
* **PCP: the partition.** Per direction group, the recurrence is a grid of ``xi`` batch-row
  groups x ``xj`` hidden-unit groups (``grid_for``): the data-movement model ``step_cost``
  (DeepCPU sec. 5.2.3: a thread's R slice is read from L1, from its own L2 if it fits - reuse
  across steps - or from L3 every step; row groups need no barrier, hidden groups one per step)
  with the target's L1/L2 sizes picks it, unless the tuning database has a measured grid
  (``smelt.tune.rnn_calibrate``; kind "rnn") or the node forces one (``smelt_rnn_grid``).
  Using fewer threads than available is a candidate (the parallelism degree).
* **Weight-centric streamlining.** Each thread keeps its partition (rows x hidden blocks, so a
  fixed slice of the fused ``R`` rows) for the whole sequence: its slice stays in its own L2.
  Threads of a row group meet once per time step (GRU with linear_before_reset=0 twice:
  ``(r ⊙ h)·Rh`` needs every thread's r). The meeting is ``VX_sync``, a barrier of per-thread
  epoch flags in scratch: one cache-line transfer per peer instead of the pool barrier's two
  or three (0.12 vs 0.25 us on the 2-core dev VM), and it lets thread subsets synchronize
  alone. Bidirectional: with 2+ threads each direction gets its own thread group and the
  groups never synchronize (parallel GEMMs in parallel), unless ``directions_in_sequence``
  finds it cheaper to run one direction after the other on all threads (a direction's R
  too big for one L2, its per-thread slices not); on one thread the directions run one
  after the other, so only one direction's R must stay in L2.
* **Ablation levels** (node attribute ``smelt_rnn_schedule``, see ``annotate``; DeepCPU Fig.
  4(a)): ``baseline`` = no hoisting, a fused-gate GEMM of x_t per step, column-split over all
  threads, partitions rotating over threads every step (a parallel GEMM without affinity);
  ``hoist`` = hoisted projection, same recurrence; ``pcp`` = the model's grid, still rotating;
  ``wcs`` (default) = the model's grid, fixed per thread.
* **Dynamic axes** (``smelt_dynamic``, set by ``smelt.api`` for recurrent models): T and B are
  read at run time from the node's int64 pair in the instance state (``BlockEmitter.state``,
  written by ``smelt.runtime.module``; not a library global, which instances of one .so would
  share); every index is a run-time expression, the tile kernels exist for every chunk size and
  the partition table has a row per batch size; scratch is sized for the compile-time shapes,
  which are the bounds.
* **Stacked layers** (``pipeline_chain`` / ``emit_pipeline``): ModelCompiler's pipeline plan.
* Hidden sizes are padded to Hp = ceil(H/16)*16 lanes; padded lanes of the state are kept at
  zero (masked), and never reach an output (masked stores).
* Weights given as runtime inputs (as in the ONNX backend tests) are packed into scratch by a
  first step each run, with the same layout the compile-time packing produces. Outputs that
  nothing reads (often Y_h / Y_c in PyTorch exports) are not computed.
* Threads write interleaved parts of shared buffers (XW panels, hidden blocks, Y rows), so
  each work item ends with a compiler barrier (``CB``): GCC 12 -O3 predictive commoning
  otherwise invents stores (loads a later iteration's targets early, stores them back at loop
  exit), which clobbered the other thread's XW panel in a stress test. Generated functions
  take no ``restrict`` parameters for the same reason (it made that transformation likelier).

Semantics follow onnxruntime exactly (it is the oracle): activation alpha/beta are consumed in
order by the functions that take them, with ORT's defaults (LeakyRelu 0.01, HardSigmoid
0.2/0.5, Elu 1.0, others 0), and the activation list must have one set per direction (ORT
rejects a single set for bidirectional; so does ``check``); clip bounds every gate
pre-activation (after bias and peephole); ``input_forget`` sets f = 1 - i; with
``sequence_lens`` a batch row is active at time t iff t < len (both directions), Y is zero
where inactive, the state freezes, and Y_h / Y_c are zero for rows of length 0 (ORT accepts 0);
lengths outside [0, T] make the inference fail (SMELT_FAIL), as ORT rejects them.
Layout 1 (batch-major) is native too (ORT itself rejects it).

Vector math: one C header per ISA, ``smelt/codegen/kernels/csrc/rnn_vec_{avx512,avx2,portable}.h``
(+ ``rnn_vec_common.h``), chosen by ``smelt/codegen/kernels/rnn_vec.py`` from the target's ISA,
which also says how many registers a 16-lane logical vector takes (AVX-512 one zmm, AVX2 two
ymm), so the register tiles (``RnnConfig.acc_budget``: 24 logical accumulators on AVX-512, 6 on
AVX2) fit the target's register file. Exp is a Cephes-style degree-6 polynomial (2^n by
``scalef``, on AVX2 by two exponent-field factors); 1/x is rcp14 (AVX2: rcp) + one Newton step
(no vdivps); sigmoid = 1/(1+exp(-x)); tanh = odd rational x*P(x^2)/Q(x^2) (degrees 13/6, Eigen's
float coefficients) on x clamped to +-7.9988, 1/Q by rcp + Newton: half the operations of the
earlier exp form (1 - 2/(exp(2|x|)+1) blended with a polynomial near 0; LSTM E64 H64 B10 T100
at 2 threads 0.353 -> 0.324 ms). Measured against libm in double precision on a dense grid over
[-30, 30] (tests/kernels/test_rnn.py, ``test_vector_math_accuracy``, per ISA): AVX-512 max abs
error 9.0e-8 (sigmoid) and 2.9e-7 (tanh), tanh max relative error 3.0e-7 for |x| < 1; the test
asserts 5e-7 / 1e-6; AVX2 1.4e-7 / 2.9e-7 (relative 3.0e-7: rcp has 12 bits, rcp14 14). The
portable header (no vector ISA: non-x86, the forced "scalar" target)
runs the same kernels on a 16-lane struct with libm (8.9e-8 / 1.0e-7). The exotic activations
Elu and Softplus always use libm lane by lane, as onnxruntime's formulas.

Modules (one job each): ``packing`` (weight layouts), ``gates`` (activations, clip),
``projection`` (the hoisted input GEMM), ``cell`` (register tiles and gate math of a step),
``dynamic`` (run-time T/B output shapes), ``pipeline`` (stacked layers), ``driver`` (the step /
barrier driver and the registration); ``common`` holds what several share. The vector math is
the C header of the target's ISA (``smelt/codegen/kernels/rnn_vec.py``), the RnnConfig of a
node ``smelt/codegen/kernels/rnn_config.py``, every decision ``smelt/schedule/rnn.py``.
"""

from smelt.codegen.templates.rnn import driver  # noqa: F401  (registers rnn_native)
