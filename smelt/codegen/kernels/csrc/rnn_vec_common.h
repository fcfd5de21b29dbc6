/* RNN helpers common to every ISA, written over the VX_ vector API of the ISA header
 * included before: the exotic activations and the group barrier.
 * Names start with VX_, replaced by the including chunk's unique prefix
 * (smelt/codegen/kernels/rnn_vec.py). Needs the headers smelt_rt.h includes. */
/* exotic activations lane by lane with libm, exactly as onnxruntime's formulas */
static inline VX_v VX_elu(VX_v v, float alpha) {
    float t[16]; VX_storeu(t, v);
    for (int l = 0; l < 16; ++l) t[l] = t[l] >= 0.0f ? t[l] : alpha * (expf(t[l]) - 1.0f);
    return VX_loadu(t);
}
static inline VX_v VX_softplus(VX_v v) {
    float t[16]; VX_storeu(t, v);
    for (int l = 0; l < 16; ++l) t[l] = logf(1.0f + expf(t[l]));
    return VX_loadu(t);
}
/* Barrier among the n threads of one group as per-thread epoch flags (one cache line each):
 * a thread publishes the epoch it finished, then waits until every peer published it too. One
 * cache-line transfer per peer instead of the counter barrier's two or three (on this class of
 * VM a transfer is ~0.12 us, a pool barrier ~0.25 us). Flags are zeroed by step 1 of each run.
 * In halves for the recurrence (VX_arrive at the end of a step, VX_wait once the thread has
 * done the work that needs no peer): the flag's trip between cores, 0.1-0.8 us on the Zen 4 VM
 * (2-thread ping-pong), and the last peer's lateness overlap that work. */
typedef struct { _Alignas(64) atomic_uint v; } VX_flag;
/* the waiting half of the barrier: until every peer of the group published ``epoch`` */
static inline void VX_wait(VX_flag *f, int me, int n, unsigned epoch) {
    for (int j = 0; j < n; ++j) {
        if (j == me) continue;
        unsigned spins = 0;
        while ((int)(atomic_load_explicit(&f[j].v, memory_order_acquire) - epoch) < 0) {
            SMELT_PAUSE();
            if (++spins > 2000u) { sched_yield(); spins = 0; } /* ~20 us: a peer thread was descheduled */
        }
    }
}
/* the publishing half: this thread finished the work of ``epoch`` (its stores before it) */
static inline void VX_arrive(VX_flag *f, int me, int n, unsigned epoch) {
    if (n > 1) atomic_store_explicit(&f[me].v, epoch, memory_order_release);
}
static inline void VX_sync(VX_flag *f, int me, int n, unsigned epoch) {
    if (n <= 1) return;
    VX_arrive(f, me, n, epoch);
    VX_wait(f, me, n, epoch);
}
