//! The selection pipeline shared by `SetSelectExec` and `MarkJoinExec`: from
//! both sides' key columns to one bit per probe-side row. Key encoding, SQL's
//! NULL rules around the keyed core, the backend and strategy, verification of
//! hashed keys, and the fallback to the CPU twin when the device fails.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::arrow::datatypes::DataType;
use datafusion::error::Result;
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, Gauge, Time};

use crate::algo::row_hash;
use crate::algo::select::{self, GpuStrategy, SetOp};
use crate::config::{SetfusionConfig, Strategy};
use crate::exec::memory::hold_device;
use crate::exec::{execution_peak_memory, execution_time, DeviceMetrics};
use crate::gpu::{self, TransferStats};
use crate::keys::{self, KeyColumns, RowSubset};

use super::common::{Backend, NullMode};

/// The selection itself, from key columns to one bit per kept-side row: key
/// encoding, NULL rules, backend and strategy, device fallbacks. Shared by
/// `SetSelectExec` and `MarkJoinExec` (whose marks are semi selections).
pub(crate) struct Selector {
    pub(crate) op: SetOp,
    pub(crate) nulls: NullMode,
    pub(crate) backend: Backend,
    /// The kept side's key column, when it is output and the device can send
    /// its kept values back (see [`SetSelectExec::key_column_in_output`]).
    pub(crate) key_from_device: Option<usize>,
    /// The kept keys the GPU backend sent back, when asked for and possible.
    pub(crate) device_keys: Mutex<Option<gpu::PendingBuffer>>,
    pub(crate) metrics: Metrics,
    pub(crate) ran: Arc<Mutex<Option<String>>>,
    /// The operator's memory reservation: grown by the encoded keys while they are held.
    pub(crate) reservation: Option<Arc<MemoryReservation>>,
}

impl Selector {
    /// A selector for `op` under `nulls` on `backend`, reporting into its
    /// execution's `metrics` (registered once per execution, not per selector).
    pub(crate) fn new(
        op: SetOp,
        nulls: NullMode,
        backend: Backend,
        metrics: Metrics,
        ran: Arc<Mutex<Option<String>>>,
    ) -> Self {
        Self {
            op,
            nulls,
            backend,
            key_from_device: None,
            device_keys: Mutex::new(None),
            metrics,
            ran,
            reservation: None,
        }
    }

    /// One bit per kept-side row (`keep_cols`: per batch, the key columns),
    /// casting both sides' keys to `types` and encoding them first; records what ran.
    pub(crate) fn select_columns(
        &self,
        cfg: &SetfusionConfig,
        probe_cols: Vec<Vec<ArrayRef>>,
        build_cols: Vec<Vec<ArrayRef>>,
        types: &[DataType],
    ) -> Result<BooleanBuffer> {
        let t = Instant::now();
        let probe_cols = probe_cols.into_iter().map(|cols| coerce_like(cols, types)).collect::<Result<Vec<_>>>()?;
        let build_cols = build_cols.into_iter().map(|cols| coerce_like(cols, types)).collect::<Result<Vec<_>>>()?;
        let (mut probe_enc, mut build_enc, nulls_in_keys) = match keys::encode_packed(&probe_cols, &build_cols, types)?
        {
            Some((k, o)) => (k, o, true),
            None => {
                let converter = keys::converter_for(types)?;
                // The GPU backend hashes hash-encoded keys on the device; only the CPU backend needs host hashes up front.
                let host_hashes = self.backend != Backend::Gpu;
                let k = keys::encode(&probe_cols, types, converter.as_ref(), host_hashes)?;
                let o = keys::encode(&build_cols, types, converter.as_ref(), host_hashes)?;
                (k, o, keys::key_bytes_carry_nulls(types))
            }
        };
        if self.nulls == NullMode::Equal && nulls_in_keys {
            // Row-encoded, column-hashed (NULL masks) and packed keys carry their NULLs:
            // (NULL, 1) and (NULL, 2) differ, (NULL, 1) equals (NULL, 1) only.
            probe_enc.nulls = None;
            build_enc.nulls = None;
        }
        self.metrics.encode_time.add_duration(t.elapsed());
        crate::util::trace("keys encoded");
        // The encoded keys' bytes, reserved while they are held.
        let encoded = encoded_bytes(&probe_enc) + encoded_bytes(&build_enc);
        if let Some(r) = &self.reservation {
            r.try_grow(encoded)?;
            self.metrics.note_memory(r);
        }
        let t = Instant::now();
        let (sel, ran) = self.select(cfg, &probe_enc, &build_enc)?;
        self.metrics.select_time.add_duration(t.elapsed());
        *self.ran.lock().unwrap() = Some(ran);
        crate::host::drop_later((probe_enc, build_enc, probe_cols, build_cols));
        if let Some(r) = &self.reservation {
            let _ = r.try_shrink(encoded);
        }
        Ok(sel)
    }

    /// Compute the selection over all kept rows, applying NULL semantics around the keyed core.
    fn select(&self, cfg: &SetfusionConfig, probe: &KeyColumns, build: &KeyColumns) -> Result<(BooleanBuffer, String)> {
        let n = probe.len();
        // NOT IN with an empty subquery keeps everything, NULL keys included;
        // with a NULL in the subquery it keeps nothing.
        if let Some(decided) = self.decided_by_nulls(n, build.len(), build.null_count()) {
            return Ok(decided);
        }
        // Rows with NULL keys leave the keyed core; their fate is decided here.
        let probe_idx: Option<Vec<u32>> =
            (probe.null_count() > 0).then(|| (0..n as u32).filter(|i| !probe.is_null(*i as usize)).collect());
        let build_idx: Option<Vec<u32>> =
            (build.null_count() > 0).then(|| (0..build.len() as u32).filter(|i| !build.is_null(*i as usize)).collect());
        let (core, ran) = self.select_keys(cfg, probe, build, &probe_idx, &build_idx)?;
        let Some(probe_idx) = probe_idx else {
            return Ok((core, ran));
        };
        Ok((
            self.with_null_rows(&core, n, &probe_idx, &|i| probe.is_null(i), (probe.null_count(), build.null_count())),
            ran,
        ))
    }

    /// Shortcuts of SQL's NULL rules that decide every row before any key is
    /// compared (NOT IN against an empty subquery or one holding a NULL).
    pub(crate) fn decided_by_nulls(
        &self,
        n: usize,
        build_rows: usize,
        build_nulls: usize,
    ) -> Option<(BooleanBuffer, String)> {
        if self.nulls == NullMode::NullAware && build_rows == 0 {
            return Some((BooleanBuffer::new_set(n), "no-op (empty subquery)".into()));
        }
        if self.nulls == NullMode::NullAware && build_nulls > 0 {
            return Some((BooleanBuffer::new_unset(n), "no-op (NULL in subquery)".into()));
        }
        None
    }

    /// The selection of all `n` probe rows from `core`, the selection of the
    /// non-NULL ones (`probe_idx`: their rows): scattered back, and the rows
    /// with NULL keys (`is_null`) decided by the rule; `(m, nb)`: the NULL
    /// keys of each side.
    pub(crate) fn with_null_rows(
        &self,
        core: &BooleanBuffer,
        n: usize,
        probe_idx: &[u32],
        is_null: &dyn Fn(usize) -> bool,
        (m, nb): (usize, usize),
    ) -> BooleanBuffer {
        let null_is_value = self.nulls == NullMode::Equal;
        // Scatter back and decide NULL-key rows.
        let mut words = vec![0u32; n.div_ceil(32)];
        for j in core.set_indices() {
            let i = probe_idx[j] as usize;
            words[i >> 5] |= 1 << (i & 31);
        }
        let null_keep_count = {
            match (self.op, null_is_value, self.nulls) {
                (_, _, NullMode::NullAware) => 0,
                (SetOp::Semi, true, _) => {
                    if nb > 0 {
                        m
                    } else {
                        0
                    }
                }
                (SetOp::Semi, false, _) => 0,
                (SetOp::Anti, true, _) => {
                    if nb > 0 {
                        0
                    } else {
                        m
                    }
                }
                (SetOp::Anti, false, _) => m,
                (SetOp::IntersectAll, ..) => m.min(nb),
                (SetOp::IntersectDistinct, ..) => (m > 0 && nb > 0) as usize,
                (SetOp::ExceptAll, ..) => m.saturating_sub(nb),
                (SetOp::ExceptDistinct, ..) => (m > 0 && nb == 0) as usize,
            }
        };
        let mut left = null_keep_count;
        for i in 0..n {
            if left == 0 {
                break;
            }
            if is_null(i) {
                words[i >> 5] |= 1 << (i & 31);
                left -= 1;
            }
        }
        select::words_to_bool(words, n)
    }

    /// The keyed core over the non-NULL keys (`*_idx`: their rows, None = all):
    /// choose backend and strategy, run, verify hashed keys.
    fn select_keys(
        &self,
        cfg: &SetfusionConfig,
        probe: &KeyColumns,
        build: &KeyColumns,
        probe_idx: &Option<Vec<u32>>,
        build_idx: &Option<Vec<u32>>,
    ) -> Result<(BooleanBuffer, String)> {
        let (Some(probe_rows), Some(build_rows)) = (&probe.bytes, &build.bytes) else {
            // Exact keys: the key is the value, nothing to verify.
            let (probe_core, build_core) = (core_keys(probe, probe_idx)?, core_keys(build, build_idx)?);
            return Ok(self.select_hashes(cfg, &probe_core.slices(), &build_core.slices(), false));
        };
        let probe_rows = RowSubset::new(probe_rows, probe_idx.as_deref())?;
        let build_rows = RowSubset::new(build_rows, build_idx.as_deref())?;
        let mut gpu_note = None;
        if self.backend == Backend::Gpu {
            // Hash and verify on the device; the host never hashes these rows.
            match self.run_gpu_rows(cfg, build_rows, probe_rows) {
                Ok(Some(sel)) => return Ok((sel, "gpu/hash (device row hashes)".into())),
                Ok(None) => {
                    let (b_ids, p_ids) = keys::exact_ids(build_rows, probe_rows);
                    let ran = "gpu/hash (device row hashes), hash collision resolved on cpu".to_string();
                    return Ok((select::select_cpu(self.op, &b_ids, &p_ids), ran));
                }
                // Too large for one device pass: hash on the host, where the GPU select partitions.
                Err(e) if gpu::is_out_of_memory(&e) => {
                    gpu_note = Some(" (rows over the device budget: host row hashes)")
                }
                Err(e) => {
                    // Device trouble never fails the query: the CPU twin gives the same answer.
                    let reason = format!("cpu (GPU failed: {})", crate::util::one_line(&e));
                    let (probe_core, build_core) = (core_keys(probe, probe_idx)?, core_keys(build, build_idx)?);
                    let sel = select::select_cpu_chunks(self.op, &build_core.slices(), &probe_core.slices());
                    return self.verify_host_hashed(sel, reason, (probe_rows, &probe_core), (build_rows, &build_core));
                }
            }
        }
        // Host hashes (the CPU backend computed them while encoding).
        let (probe_core, build_core) = (core_keys(probe, probe_idx)?, core_keys(build, build_idx)?);
        let (sel, mut ran) = self.select_hashes(cfg, &probe_core.slices(), &build_core.slices(), true);
        ran.push_str(gpu_note.unwrap_or(""));
        self.verify_host_hashed(sel, ran, (probe_rows, &probe_core), (build_rows, &build_core))
    }

    /// Hashed keys selected on host hashes: make sure equal hashes meant equal
    /// rows; on a collision recompute exactly.
    fn verify_host_hashed(
        &self,
        sel: BooleanBuffer,
        mut ran: String,
        probe: (RowSubset<'_>, &CoreKeys<'_>),
        build: (RowSubset<'_>, &CoreKeys<'_>),
    ) -> Result<(BooleanBuffer, String)> {
        let (kh, oh) = (probe.1.contiguous(), build.1.contiguous());
        match keys::verify_rows_or_exact(build.0, &oh, probe.0, &kh) {
            None => Ok((sel, ran)),
            Some((b_ids, p_ids)) => {
                ran.push_str(", hash collision resolved on cpu");
                Ok((select::select_cpu(self.op, &b_ids, &p_ids), ran))
            }
        }
    }

    /// Select on 64-bit keys with the configured backend (hash-encoded keys: `hashed`).
    fn select_hashes(
        &self,
        cfg: &SetfusionConfig,
        probe_core: &[&[u64]],
        build_core: &[&[u64]],
        hashed: bool,
    ) -> (BooleanBuffer, String) {
        match &self.backend {
            Backend::Cpu => (select::select_cpu_chunks(self.op, build_core, probe_core), "cpu".to_string()),
            Backend::Gpu => match self.run_gpu(cfg, probe_core, build_core, hashed) {
                Ok(r) => r,
                Err(e) => {
                    // Device trouble never fails the query: the CPU twin gives the same answer.
                    (
                        select::select_cpu_chunks(self.op, build_core, probe_core),
                        format!("cpu (GPU failed: {})", crate::util::one_line(&e)),
                    )
                }
            },
        }
    }

    /// Hashed keys on the GPU: device row hashes, device verification, device select.
    fn run_gpu_rows(
        &self,
        cfg: &SetfusionConfig,
        build: RowSubset<'_>,
        probe: RowSubset<'_>,
    ) -> Result<Option<BooleanBuffer>> {
        let device = gpu::gpu(cfg.device).map_err(crate::gpu::GpuError::from)?;
        let g = hold_device(&device, cfg, self.reservation.as_deref())?;
        self.metrics.note_memory_holding(self.reservation.as_deref(), 1);
        let mut stats = TransferStats::default();
        let r = row_hash::select_subsets_gpu(&g, self.op, build, probe, &mut stats);
        self.metrics.device.record(&stats);
        r
    }

    fn run_gpu(
        &self,
        cfg: &SetfusionConfig,
        probe_core: &[&[u64]],
        build_core: &[&[u64]],
        hashed: bool,
    ) -> Result<(BooleanBuffer, String)> {
        let forced = forced_strategy(cfg, hashed);
        let keys: usize = probe_core.iter().chain(build_core).map(|c| c.len()).sum();
        let ordinals = cfg.device_ordinals(gpu::device_count);
        if ordinals.len() > 1 && keys >= cfg.min_rows {
            return self.run_gpus(cfg, &ordinals, forced, probe_core, build_core);
        }
        let device = gpu::gpu(cfg.device).map_err(crate::gpu::GpuError::from)?;
        let g = hold_device(&device, cfg, self.reservation.as_deref())?;
        self.metrics.note_memory_holding(self.reservation.as_deref(), 1);
        let mut stats = TransferStats::default();
        // Exact keys only (they come back into pinned memory the output owns);
        // the output filter checks that they cover every kept row.
        let want_keys = self.key_from_device.is_some() && !hashed && cfg.pinned_output;
        let (sel, ran, keys) =
            select::select_gpu_auto(&g, forced, self.op, build_core, probe_core, want_keys, &mut stats)?;
        *self.device_keys.lock().unwrap_or_else(|e| e.into_inner()) = keys;
        self.metrics.device.record(&stats);
        Ok((sel, ran))
    }
}

impl Selector {
    /// [`select::select_gpus`]: one key partition per entry of `ordinals`.
    /// Every device is held for the run, taken in ascending order so that two
    /// queries over the same devices cannot each hold one the other waits for.
    fn run_gpus(
        &self,
        cfg: &SetfusionConfig,
        ordinals: &[usize],
        forced: Option<GpuStrategy>,
        probe_core: &[&[u64]],
        build_core: &[&[u64]],
    ) -> Result<(BooleanBuffer, String)> {
        let mut distinct = ordinals.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let devices = distinct
            .iter()
            .map(|&o| gpu::gpu(o).map_err(crate::gpu::GpuError::from))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let held =
            devices.iter().map(|d| hold_device(d, cfg, self.reservation.as_deref())).collect::<Result<Vec<_>>>()?;
        self.metrics.note_memory_holding(self.reservation.as_deref(), held.len());
        let parts: Vec<&gpu::Gpu> =
            ordinals.iter().map(|o| &*held[distinct.binary_search(o).expect("every ordinal is held")]).collect();
        let mut stats = TransferStats::default();
        let r = select::select_gpus(&parts, forced, self.op, build_core, probe_core, &mut stats)?;
        self.metrics.device.record(&stats);
        Ok(r)
    }
}

/// The GPU strategy the settings force, if any. Hashed keys only support the
/// hash table (their "domain" is meaningless); sort takes any 64-bit keys.
pub(crate) fn forced_strategy(cfg: &SetfusionConfig, hashed: bool) -> Option<GpuStrategy> {
    match cfg.strategy {
        Strategy::Sort => Some(GpuStrategy::Sort),
        _ if hashed => Some(GpuStrategy::Hash),
        Strategy::Hash => Some(GpuStrategy::Hash),
        Strategy::Bitmap => Some(GpuStrategy::Bitmap),
        Strategy::Auto | Strategy::Cpu => None,
    }
}

/// An estimate of the bytes of encoded keys: 8 per key (borrowed 64-bit
/// columns included, an over-estimate there) and the row encoding's bytes.
fn encoded_bytes(k: &KeyColumns) -> usize {
    let rows = match &k.bytes {
        Some(keys::KeyBytes::Rows(r)) => r.size(),
        _ => 0,
    };
    k.chunks.iter().map(|c| c.len() * 8).sum::<usize>() + rows
}

/// One side's non-NULL keys as slices: the chunks themselves when no row is dropped.
pub(crate) enum CoreKeys<'a> {
    Borrowed(Vec<&'a [u64]>),
    Owned(Vec<u64>),
}

impl CoreKeys<'_> {
    fn slices(&self) -> Vec<&[u64]> {
        match self {
            CoreKeys::Borrowed(v) => v.clone(),
            CoreKeys::Owned(v) => vec![v.as_slice()],
        }
    }
    /// The keys in one slice (borrowed when they already are).
    fn contiguous(&self) -> std::borrow::Cow<'_, [u64]> {
        match self {
            CoreKeys::Borrowed(v) if v.len() == 1 => std::borrow::Cow::Borrowed(v[0]),
            CoreKeys::Borrowed(v) => std::borrow::Cow::Owned(v.concat()),
            CoreKeys::Owned(v) => std::borrow::Cow::Borrowed(v.as_slice()),
        }
    }
}

/// One side's keys at `idx` (None: all rows): exact values, or row hashes
/// (computed here on the host when encoding deferred them to the device).
pub(crate) fn core_keys<'a>(k: &'a KeyColumns, idx: &Option<Vec<u32>>) -> Result<CoreKeys<'a>> {
    if let (Some(rows), true) = (&k.bytes, k.hashes_deferred()) {
        return Ok(CoreKeys::Owned(keys::hash_rows(RowSubset::new(rows, idx.as_deref())?)));
    }
    Ok(match idx {
        None => CoreKeys::Borrowed(k.slices()),
        Some(_) => CoreKeys::Owned(k.iter().enumerate().filter(|(i, _)| !k.is_null(*i)).map(|(_, v)| v).collect()),
    })
}

/// Cast key columns to the types they are encoded as ([`keys::key_type`]:
/// dictionaries to their values or views; the other side to the kept side's
/// types, which the planner already coerced, guarding view variants).
pub(crate) fn coerce_like(cols: Vec<ArrayRef>, types: &[DataType]) -> Result<Vec<ArrayRef>> {
    cols.into_iter()
        .zip(types)
        .map(|(c, t)| if c.data_type() == t { Ok(c) } else { Ok(datafusion::arrow::compute::cast(&c, t)?) })
        .collect()
}

/// Evaluate key expressions on every batch: `out[b][k]` is key k of batch b.
pub(crate) fn key_columns(batches: &[&RecordBatch], exprs: &[PhysicalExprRef]) -> Result<Vec<Vec<ArrayRef>>> {
    crate::host::par_map(batches, 128, |b| {
        exprs.iter().map(|e| e.evaluate(b).and_then(|v| v.into_array(b.num_rows()))).collect()
    })
}

/// The metrics of one execution of a selection's operator (`SetSelectExec`,
/// `MarkJoinExec`), registered once per execution and shared by its
/// [`Selector`]s (a mark join runs up to three selections). `Default`: not
/// registered, a stand-in until the execution starts and registers its own.
#[derive(Clone, Default)]
pub(crate) struct Metrics {
    pub(crate) device: DeviceMetrics,
    pub(crate) encode_time: Time,
    /// Waiting for both inputs to be collected.
    pub(crate) input_time: Time,
    /// Cutting the kept rows out of the kept side's batches (host, copy threads).
    pub(crate) output_filter_time: Time,
    /// The whole selection (both backends, NULL handling, transfers, kernels).
    pub(crate) select_time: Time,
    /// The peak of the execution's memory reservation (set where it grows).
    pub(crate) peak_memory: Gauge,
}
impl Metrics {
    /// Registered in `m` for one execution; `partition` as for [`DeviceMetrics::new`].
    pub(crate) fn new(m: &ExecutionPlanMetricsSet, partition: Option<usize>) -> Self {
        Self {
            device: DeviceMetrics::new(m, partition),
            encode_time: execution_time(m, "key_encode_time", partition),
            input_time: execution_time(m, "input_time", partition),
            output_filter_time: execution_time(m, "output_filter_time", partition),
            select_time: execution_time(m, "select_time", partition),
            peak_memory: execution_peak_memory(m, partition),
        }
    }

    /// Note the reservation's size in the peak.
    pub(crate) fn note_memory(&self, reservation: &MemoryReservation) {
        self.peak_memory.set_max(reservation.size());
    }

    /// Note the reservation's size in the peak while the device is held:
    /// its pinned staging (`held` devices' worth) is reserved beside it.
    fn note_memory_holding(&self, reservation: Option<&MemoryReservation>, held: usize) {
        if let Some(r) = reservation {
            self.peak_memory.set_max(r.size() + held * gpu::STAGING_HOST_BYTES);
        }
    }
}
