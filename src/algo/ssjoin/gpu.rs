//! The GPU backend, the launcher of kernels/ssjoin.cu (sf-gSSJoin style).

use std::time::Instant;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use datafusion::error::{DataFusionError, Result};

use crate::algo::ssjoin_prep::preprocess;
use crate::gpu::{cuda_err, Gpu, TransferStats};

use super::cpu::*;
use super::plan::*;
use super::*;

/// kernels/ssjoin.cu, with its contract constants as `-D` options.
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "ssjoin",
    source: include_str!("../../../kernels/ssjoin.cu"),
    defines: ssjoin_defines,
};

fn ssjoin_defines() -> Vec<(String, u64)> {
    vec![("SF_BLOCK".into(), JOIN_BLOCK as u64)]
}

/// Threads per CUDA block of `join_probes` (the kernel's SF_BLOCK).
pub(super) const JOIN_BLOCK: u32 = 128;
/// Slots of the shared-memory candidate table of the first pass: 16 bytes
/// each (key, count, last position, compaction list) = 32 KiB per CUDA block,
/// under the 48 KiB default, so about six blocks fit an SM. Probes with more
/// distinct candidates run again with tables in global memory.
pub(super) const SHARED_SLOTS: u32 = 2048;
/// CUDA blocks per SM for the grid-stride loops over probes when the
/// occupancy query fails (normally the grid is what fits at once, so no
/// block starts late with a full share of probes).
pub(super) const BLOCKS_PER_SM: u32 = 4;
/// Result triples the output buffer starts with (it grows on overflow).
pub(super) const MAX_OUT_START: usize = 1 << 24;

/// Table slots for a probe with at most `m` distinct candidates (the
/// kernel's `sf_table_slots`): a power of two >= 1.5 m + 1, at least 32.
pub(super) fn table_slots(m: u32) -> usize {
    let want = m as u64 + (m >> 1) as u64 + 1;
    want.next_power_of_two().clamp(32, 1 << 31) as usize
}

/// The device-resident inputs of one join, in two buffers (the collection,
/// uploaded while the host builds the plan; then the plan's tables and
/// index), passed to the kernel as views.
pub(super) struct DeviceInputs {
    pub(super) bufs: [crate::gpu::DeviceBuffer<u32>; 2],
    /// (buffer, range) of r_off, r_tok, s_off, s_tok, pp, lo, hi, idx_off, idx_sets
    pub(super) ranges: [(usize, std::ops::Range<usize>); 9],
}

/// Kernel arguments fixed for the whole join, and one launch of
/// `join_probes` (the only kernel), so the launch list lives in one place.
pub(super) struct JoinKernel<'a> {
    pub(super) gpu: &'a Gpu,
    pub(super) f: cudarc::driver::CudaFunction,
    pub(super) inputs: &'a DeviceInputs,
    pub(super) self_join: i32,
    pub(super) metric: i32,
    pub(super) t: f64,
    pub(super) strict: i32,
    pub(super) shared_slots: u32,
}

/// Where one launch takes its probes and candidate tables from.
pub(super) enum Probes<'a> {
    /// Probe positions `first..first + n`, shared-memory tables; probes
    /// whose table would exceed [`SHARED_SLOTS`] are deferred to `big`.
    Range { first: u32, n: u32 },
    /// Probe positions `list[first..first + n]`, global tables at
    /// `tab + tab_off[first + i]` (4 * slots words each).
    Listed {
        list: &'a crate::gpu::DeviceBuffer<u32>,
        tab: &'a crate::gpu::DeviceBuffer<u32>,
        tab_off: &'a crate::gpu::DeviceBuffer<u64>,
        first: u32,
        n: u32,
    },
}

impl JoinKernel<'_> {
    pub(super) fn launch(
        &self,
        probes: &Probes,
        big: &crate::gpu::DeviceBuffer<u32>,
        counters: &crate::gpu::DeviceBuffer<u64>,
        out: &crate::gpu::DeviceBuffer<u32>,
        out_cap: u64,
    ) -> Result<()> {
        let stream = self.gpu.stream();
        let v: Vec<_> = self.inputs.ranges.iter().map(|(b, r)| self.inputs.bufs[*b].slice.slice(r.clone())).collect();
        let null: u64 = 0;
        let (first, n, shared) = match probes {
            Probes::Range { first, n } => (*first, *n, self.shared_slots),
            Probes::Listed { first, n, .. } => (*first, *n, 0),
        };
        if n == 0 {
            return Ok(());
        }
        let sms = self.gpu.info().multiprocessors.max(1) as u32;
        let per_sm = self
            .f
            .occupancy_max_active_blocks_per_multiprocessor(JOIN_BLOCK, shared as usize * 16, None)
            .unwrap_or(BLOCKS_PER_SM)
            .max(1);
        let cfg = LaunchConfig {
            grid_dim: (n.min(sms * per_sm), 1, 1),
            block_dim: (JOIN_BLOCK, 1, 1),
            shared_mem_bytes: shared * 16,
        };
        let mut b = stream.launch_builder(&self.f);
        for view in &v {
            b.arg(view);
        }
        b.arg(&self.self_join).arg(&self.metric).arg(&self.t).arg(&self.strict);
        match probes {
            Probes::Range { .. } => b.arg(&null),
            Probes::Listed { list, .. } => b.arg(&list.slice),
        };
        b.arg(&first).arg(&n);
        match probes {
            Probes::Range { .. } => b.arg(&null).arg(&null),
            Probes::Listed { tab, tab_off, .. } => b.arg(&tab.slice).arg(&tab_off.slice),
        };
        b.arg(&shared).arg(&big.slice).arg(&counters.slice).arg(&out.slice).arg(&out_cap);
        // SAFETY: the argument list matches kernels/ssjoin.cu join_probes. The tables cover every probe size and the
        // index every token; deferred probes (< n per launch) fit `big` (2 words per probe of the join); a listed
        // probe's region (4 * table_slots(m) words at tab_off) lies inside `tab`; at most out_cap triples are written.
        unsafe { b.launch(cfg) }.map_err(|e| cuda_err("ssjoin join_probes", e))?;
        Ok(())
    }
}

/// Knobs of the GPU path; tests shrink them to force the deferred-probe,
/// grouping and output-overflow paths on small inputs.
#[derive(Debug, Clone, Copy)]
pub(super) struct GpuTuning {
    /// Shared-memory table slots per CUDA block in the first pass.
    pub(super) shared_slots: u32,
    /// Initial output buffer (triples); None: from the budget.
    pub(super) out_start: Option<usize>,
}

pub(super) const DEFAULT_TUNING: GpuTuning = GpuTuning { shared_slots: SHARED_SLOTS, out_start: None };

/// Device counters: result triples, deferred probes, candidates, index entries.
pub(super) fn read_counters(gpu: &Gpu, c: &crate::gpu::DeviceBuffer<u64>, ts: &mut TransferStats) -> Result<[u64; 4]> {
    let v = gpu.download(c, 4, ts)?;
    Ok([v[0], v[1], v[2], v[3]])
}

/// GPU backend (kernels/ssjoin.cu); same contract as [`ssjoin_cpu`]. The
/// caller holds the device lock and has set the memory budget. Errors
/// (including "does not fit the budget") are returned, never panicked.
///
/// Host <-> device traffic: one upload of the preprocessed collection, the
/// length tables and the prefix index; one launch over all probes with
/// shared-memory candidate tables; a read of four counters; the result
/// triples. Only probes with more distinct candidates than a shared table
/// holds (skewed data, low thresholds) cost a second round: their list goes
/// up and they run in groups whose global-memory tables fit the budget,
/// without a host wait between groups unless the output buffer could fill.
pub fn ssjoin_gpu(
    gpu: &Gpu,
    r: &SetCollection,
    s: Option<&SetCollection>,
    thr: Threshold,
    stats: &mut JoinStats,
) -> Result<Vec<Pair>> {
    ssjoin_gpu_tuned(gpu, r, s, thr, stats, DEFAULT_TUNING)
}

pub(super) fn ssjoin_gpu_tuned(
    gpu: &Gpu,
    r: &SetCollection,
    s: Option<&SetCollection>,
    thr: Threshold,
    stats: &mut JoinStats,
    tuning: GpuTuning,
) -> Result<Vec<Pair>> {
    let self_join = s.is_none();
    let s_c = s.unwrap_or(r);
    let n_r = r.len();
    if n_r == 0 || s_c.is_empty() {
        return Ok(Vec::new());
    }
    if r.tokens.len() >= u32::MAX as usize || s_c.tokens.len() >= u32::MAX as usize {
        return Err(crate::gpu::GpuError::Kernel {
            family: "ssjoin".into(),
            detail: "more than 2^32 set elements".into(),
        }
        .into());
    }

    // The collection goes up on a second thread while this one builds the
    // plan (length tables + prefix index), so its staging copy and DMA hide
    // behind the index build instead of following it; the plan's arrays
    // follow in a second, smaller upload.
    let mut collection: Vec<&[u32]> = vec![&r.offsets, &r.tokens];
    if !self_join {
        collection.extend([s_c.offsets.as_slice(), s_c.tokens.as_slice()]);
    }
    let (plan, plan_time, uploaded) = crate::host::scope(|scope| {
        let up = scope.spawn("ssjoin-upload", || -> Result<(crate::gpu::DeviceBuffer<u32>, TransferStats)> {
            // A fresh thread has no current CUDA context.
            gpu.context().bind_to_thread().map_err(|e| cuda_err("bind CUDA context", e))?;
            let mut st = TransferStats::default();
            let buf = gpu.upload_chunks(&collection, &mut st)?;
            Ok((buf, st))
        });
        let started = Instant::now();
        let plan = Plan::new(r, s, thr, false, default_threads());
        let plan_time = started.elapsed();
        let uploaded = up
            .join()
            .unwrap_or_else(|_| Err(DataFusionError::Internal("ssjoin: collection upload thread panicked".into())));
        (plan, plan_time, uploaded)
    });
    stats.plan += plan_time;
    let (collection_buf, upload_stats) = uploaded?;
    stats.transfer.add(&upload_stats);
    if plan.index.sets.is_empty() {
        return Ok(Vec::new());
    }
    let ts = &mut stats.transfer;
    let stream = gpu.stream().clone();

    let plan_arrays: [&[u32]; 5] =
        [&plan.tables.probe_prefix, &plan.tables.lo_pos, &plan.tables.hi_pos, &plan.index.offsets, &plan.index.sets];
    let plan_buf = gpu.upload_chunks(&plan_arrays, ts)?;
    let mut ranges: Vec<(usize, std::ops::Range<usize>)> = Vec::with_capacity(9);
    let mut at = 0;
    for c in &collection {
        ranges.push((0, at..at + c.len()));
        at += c.len();
    }
    if self_join {
        // s_off, s_tok are r_off, r_tok.
        ranges.extend([ranges[0].clone(), ranges[1].clone()]);
    }
    at = 0;
    for c in &plan_arrays {
        ranges.push((1, at..at + c.len()));
        at += c.len();
    }
    let ranges: [(usize, std::ops::Range<usize>); 9] =
        ranges.try_into().map_err(|_| DataFusionError::Internal("ssjoin: input layout".into()))?;
    let inputs = DeviceInputs { bufs: [collection_buf, plan_buf], ranges };
    let kernel = JoinKernel {
        gpu,
        f: gpu.function(&KERNEL, "join_probes")?,
        inputs: &inputs,
        self_join: plan.self_join as i32,
        metric: thr.metric as i32,
        t: thr.value,
        strict: thr.strict as i32,
        shared_slots: tuning.shared_slots,
    };
    let mut counters = gpu.alloc_zeros::<u64>(4)?;
    let big = gpu.alloc::<u32>(2 * n_r)?;
    let avail = |gpu: &Gpu| gpu.budget().available().min(gpu.free_memory().unwrap_or(usize::MAX)) / 10 * 9;
    let mut out_cap = tuning.out_start.unwrap_or_else(|| (avail(gpu) / 8 / 12).clamp(1024, MAX_OUT_START)).max(1);
    let mut out = gpu.alloc::<u32>(out_cap * 3)?;
    let mut result: Vec<Pair> = Vec::new();
    let mut push = |triples: Vec<u32>| result.extend(triples.chunks_exact(3).map(|c| plan.pair(c[0], c[1], c[2])));

    // 1. All probes with shared-memory tables. If the results overflow the
    // output buffer, grow it (or, if the budget says no, halve the range).
    let mut deferred: Vec<(u32, u32)> = Vec::new();
    let mut ranges = vec![(0u32, n_r as u32)];
    while let Some((a, b)) = ranges.pop() {
        stream.memset_zeros(&mut counters.slice).map_err(|e| cuda_err("memset", e))?;
        let t = Instant::now();
        kernel.launch(&Probes::Range { first: a, n: b - a }, &big, &counters, &out, out_cap as u64)?;
        let c = read_counters(gpu, &counters, ts)?;
        ts.kernel += t.elapsed();
        stats.blocks += 1;
        if c[0] > out_cap as u64 {
            let need = usize::try_from(c[0]).unwrap_or(usize::MAX);
            drop(out);
            match gpu.alloc::<u32>(need.saturating_mul(3)) {
                Ok(o) => {
                    out = o;
                    out_cap = need;
                    ranges.push((a, b));
                }
                Err(_) if b - a > 1 => {
                    out = gpu.alloc::<u32>(out_cap * 3)?;
                    let mid = a + (b - a) / 2;
                    ranges.extend([(mid, b), (a, mid)]);
                }
                Err(e) => return Err(e),
            }
            continue;
        }
        stats.candidates += c[2];
        stats.hits += c[3];
        if c[0] > 0 {
            push(gpu.download(&out, c[0] as usize * 3, ts)?);
        }
        if c[1] > 0 {
            let list = gpu.download(&big, c[1] as usize * 2, ts)?;
            deferred.extend(list.chunks_exact(2).map(|p| (p[0], p[1])));
        }
    }

    // 2. Probes with many candidates: global-memory tables, in groups whose
    // tables fit the scratch buffer and whose results (at most their distinct
    // candidates) fit the output buffer, so no group can overflow it.
    if !deferred.is_empty() {
        deferred.sort_unstable();
        let words: Vec<usize> = deferred.iter().map(|&(_, m)| 4 * table_slots(m)).collect();
        let total_words: usize = words.iter().sum();
        let largest = words.iter().copied().max().unwrap_or(0);
        let list_host: Vec<u32> = deferred.iter().map(|&(x, _)| x).collect();
        let list = gpu.upload(&list_host, ts)?;
        // A group is at least one probe: the output must hold its bound.
        let largest_bound = deferred.iter().map(|&(_, m)| m as usize).max().unwrap_or(0);
        if largest_bound > out_cap {
            drop(out);
            out = gpu.alloc::<u32>(largest_bound * 3)?;
            out_cap = largest_bound;
        }
        let scratch_words = total_words.min(avail(gpu).saturating_sub(deferred.len() * 8) / 4);
        if largest > scratch_words {
            return Err(crate::gpu::GpuError::over_budget(
                "similarity join probe's candidate table",
                largest * 4,
                scratch_words * 4,
            )
            .into());
        }
        let mut groups: Vec<(usize, usize, u64)> = Vec::new(); // (first, end, distinct bound)
        let mut offsets = Vec::with_capacity(deferred.len());
        let (mut g0, mut used, mut bound) = (0usize, 0usize, 0u64);
        for (i, &w) in words.iter().enumerate() {
            let m = deferred[i].1 as u64;
            if i > g0 && (used + w > scratch_words || bound + m > out_cap as u64) {
                groups.push((g0, i, bound));
                (g0, used, bound) = (i, 0, 0);
            }
            offsets.push(used as u64);
            used += w;
            bound += m;
        }
        groups.push((g0, words.len(), bound));
        let tab_off = gpu.upload(&offsets, ts)?;
        let tab = gpu.alloc::<u32>(scratch_words)?;
        stream.memset_zeros(&mut counters.slice).map_err(|e| cuda_err("memset", e))?;
        let mut pending = 0u64; // bound on the triples in `out` not yet downloaded
        let t = Instant::now();
        for &(first, end, gbound) in &groups {
            if pending + gbound > out_cap as u64 {
                drain(gpu, &out, &mut counters, ts, (&mut stats.candidates, &mut stats.hits), &mut push)?;
                pending = 0;
            }
            let probes = Probes::Listed {
                list: &list,
                tab: &tab,
                tab_off: &tab_off,
                first: first as u32,
                n: (end - first) as u32,
            };
            kernel.launch(&probes, &big, &counters, &out, out_cap as u64)?;
            pending += gbound;
            stats.blocks += 1;
        }
        drain(gpu, &out, &mut counters, ts, (&mut stats.candidates, &mut stats.hits), &mut push)?;
        ts.kernel += t.elapsed();
    }
    stats.results += result.len() as u64;
    Ok(result)
}

/// Wait for the launches so far, take their result triples and counts, and
/// zero the counters for the next launches.
pub(super) fn drain(
    gpu: &Gpu,
    out: &crate::gpu::DeviceBuffer<u32>,
    counters: &mut crate::gpu::DeviceBuffer<u64>,
    ts: &mut TransferStats,
    (candidates, hits): (&mut u64, &mut u64),
    push: &mut dyn FnMut(Vec<u32>),
) -> Result<()> {
    let c = read_counters(gpu, counters, ts)?;
    *candidates += c[2];
    *hits += c[3];
    if c[0] > 0 {
        push(gpu.download(out, c[0] as usize * 3, ts)?);
    }
    gpu.stream().memset_zeros(&mut counters.slice).map_err(|e| cuda_err("memset", e))?;
    Ok(())
}

/// Doctor self-check: the GPU join against brute force on random collections,
/// every metric, self and R-S joins.
pub fn self_check(gpu: &Gpu) -> Result<String> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut random_sets = |n: usize| {
        let sets: Vec<Vec<u64>> =
            (0..n).map(|_| (0..rng.random_range(0..20)).map(|_| rng.random_range(0..60u64)).collect()).collect();
        RawSets::from_vecs(&sets)
    };
    let (r, s) = (random_sets(300), random_sets(200));
    let (rc, sc) = preprocess(&r, Some(&s));
    let sc = sc.unwrap();
    let (selfc, _) = preprocess(&r, None);
    let mut checked = 0;
    for (metric, t) in [(Metric::Jaccard, 0.5), (Metric::Dice, 0.6), (Metric::Cosine, 0.7), (Metric::Overlap, 3.0)] {
        let thr = Threshold::new(metric, t);
        for (a, b) in [(&rc, Some(&sc)), (&selfc, None)] {
            let mut want = ssjoin_brute_force(a, b, thr);
            let mut got = ssjoin_gpu(gpu, a, b, thr, &mut JoinStats::default())?;
            want.sort_unstable();
            got.sort_unstable();
            if got != want {
                return Err(DataFusionError::Execution(format!(
                    "ssjoin self-check failed: {} >= {t}: gpu {} pairs, brute force {}",
                    metric.name(),
                    got.len(),
                    want.len()
                )));
            }
            checked += 1;
        }
    }
    Ok(format!("{checked} joins match brute force"))
}
