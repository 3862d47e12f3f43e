//! The CPU backend: a multithreaded PPJoin over the prefix index.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use super::plan::*;
use super::*;

/// Run `work(chunk_start, chunk_end, state)` over `[0, n)` in chunks on
/// `threads` threads; returns the per-thread outputs.
pub(super) fn parallel_chunks<S: Send, F>(
    n: usize,
    threads: usize,
    chunk: usize,
    init: impl Fn() -> S + Sync,
    work: F,
) -> Vec<S>
where
    F: Fn(usize, usize, &mut S) + Sync,
{
    let next = AtomicUsize::new(0);
    let threads = threads.clamp(1, n.div_ceil(chunk).max(1));
    crate::host::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn("ssjoin-cpu", || {
                    let mut st = init();
                    loop {
                        let start = next.fetch_add(chunk, Ordering::Relaxed);
                        if start >= n {
                            break;
                        }
                        work(start, (start + chunk).min(n), &mut st);
                    }
                    st
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("ssjoin worker panicked")).collect()
    })
}

/// A stride through `0..n` coprime to `n`, near its golden section: chunk
/// `k` of `n` handed out is `k * stride % n`, a permutation that visits the
/// small and the large sets (collections are in size order) alike from the
/// first chunks on.
pub(super) fn scatter_stride(n: usize) -> usize {
    let gcd = |mut a: usize, mut b: usize| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let mut stride = ((n as f64 * 0.618_033_988_75) as usize).max(1);
    while gcd(stride, n) != 1 {
        stride += 1;
    }
    stride
}

/// Default thread count: the machine's available parallelism.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// CPU backend (PPJoin, all cores). `s = None`: self join, pairs `id_a < id_b`.
pub fn ssjoin_cpu(r: &SetCollection, s: Option<&SetCollection>, thr: Threshold) -> Vec<Pair> {
    ssjoin_cpu_with(r, s, thr, default_threads(), &mut JoinStats::default())
}

/// [`ssjoin_cpu`] with an explicit thread count and statistics.
pub fn ssjoin_cpu_with(
    r: &SetCollection,
    s: Option<&SetCollection>,
    thr: Threshold,
    threads: usize,
    stats: &mut JoinStats,
) -> Vec<Pair> {
    ssjoin_cpu_until(r, s, thr, threads, stats, &|_| false).unwrap_or_default()
}

/// [`ssjoin_cpu_with`] that gives up (None) once `give_up(done)` says so.
/// The workers ask between chunks of 64 probes; `done` is the share of the
/// probe side's elements handed out so far (larger sets probe more, so
/// elements say more about the work left than sets do). Chunks are handed
/// out in a scattered order ([`scatter_stride`]), so the work done at any
/// moment is a fair sample of the whole and `done` extrapolates it: in size
/// order, a join's first tenth of elements (its smallest sets) took far less
/// than a tenth of its time, and the early extrapolation started a device
/// for 60 ms joins (BENCHMARKS section 49). Callers: the benchmark's CPU cap
/// (a deadline), and the similarity join's run on the host while the device
/// starts or is not started (it stops once the device would finish first).
pub fn ssjoin_cpu_until(
    r: &SetCollection,
    s: Option<&SetCollection>,
    thr: Threshold,
    threads: usize,
    stats: &mut JoinStats,
    give_up: &(dyn Fn(f64) -> bool + Sync),
) -> Option<Vec<Pair>> {
    let expired = std::sync::atomic::AtomicBool::new(false);
    let elements = (*r.offsets.last().unwrap_or(&0)).max(1) as f64;
    let started = Instant::now();
    let plan = Plan::new(r, s, thr, true, threads);
    stats.plan += started.elapsed();
    let n_s = plan.s.len();
    struct State {
        counts: Vec<u32>,
        touched: Vec<u32>,
        out: Vec<Pair>,
        candidates: u64,
        alpha_size: u32,
        alpha_lo: u32,
        alpha: Vec<u32>,
    }
    const PRUNED: u32 = u32::MAX;
    let chunk = 64;
    let chunks = r.len().div_ceil(chunk);
    let stride = scatter_stride(chunks);
    let handed = AtomicUsize::new(0);
    let states = parallel_chunks(
        r.len(),
        threads,
        chunk,
        || State {
            counts: vec![0; n_s],
            touched: Vec::new(),
            out: Vec::new(),
            candidates: 0,
            alpha_size: 0,
            alpha_lo: 0,
            alpha: Vec::new(),
        },
        |start, _, st| {
            let start = (start / chunk * stride % chunks) * chunk;
            let end = (start + chunk).min(r.len());
            let size = (r.offsets[end] - r.offsets[start]) as usize;
            let done = handed.fetch_add(size, Ordering::Relaxed) + size;
            if expired.load(Ordering::Relaxed) || give_up(done as f64 / elements) {
                expired.store(true, Ordering::Relaxed);
                return;
            }
            for x in start..end {
                let a = r.size(x);
                let p = plan.tables.probe_prefix[a as usize] as usize;
                let (lo, hi) = plan.window(x);
                if p == 0 || lo >= hi {
                    continue;
                }
                if st.alpha_size != a {
                    // Minimum overlaps for this probe size over its partner sizes.
                    let (ls, hs) = (plan.tables.lo_size[a as usize], plan.tables.hi_size[a as usize]);
                    st.alpha_size = a;
                    st.alpha_lo = ls;
                    st.alpha.clear();
                    st.alpha.extend((ls..=hs).map(|b| thr.min_overlap(a, b).unwrap_or(u32::MAX)));
                }
                let xs = r.set(x);
                for (i, &w) in xs[..p].iter().enumerate() {
                    let (ls, le) =
                        (plan.index.offsets[w as usize] as usize, plan.index.offsets[w as usize + 1] as usize);
                    let list = &plan.index.sets[ls..le];
                    let from = list.partition_point(|&y| y < lo);
                    let to = from + list[from..].partition_point(|&y| y < hi);
                    for k in from..to {
                        let y = list[k] as usize;
                        let c = st.counts[y];
                        if c == PRUNED {
                            continue;
                        }
                        if c == 0 {
                            st.touched.push(y as u32);
                        }
                        let b = plan.s_sizes[y];
                        let j = plan.index.positions[ls + k];
                        let alpha = st.alpha[(b - st.alpha_lo) as usize];
                        let ub = c + 1 + (a - i as u32 - 1).min(b - j - 1);
                        st.counts[y] = if ub >= alpha { c + 1 } else { PRUNED };
                    }
                }
                for t in 0..st.touched.len() {
                    let y = st.touched[t] as usize;
                    let c = std::mem::take(&mut st.counts[y]);
                    if c == PRUNED {
                        continue;
                    }
                    st.candidates += 1;
                    let b = plan.s_sizes[y];
                    let alpha = st.alpha[(b - st.alpha_lo) as usize];
                    if let Some(o) = overlap_at_least(xs, plan.s.set(y), alpha) {
                        if thr.passes(o, a, b) {
                            st.out.push(plan.pair(x as u32, y as u32, o));
                        }
                    }
                }
                st.touched.clear();
            }
        },
    );
    if expired.load(Ordering::Relaxed) {
        return None;
    }
    let mut out = Vec::with_capacity(states.iter().map(|s| s.out.len()).sum());
    for st in states {
        stats.candidates += st.candidates;
        out.extend(st.out);
    }
    stats.results += out.len() as u64;
    stats.blocks += r.len().div_ceil(chunk) as u64;
    Some(out)
}
