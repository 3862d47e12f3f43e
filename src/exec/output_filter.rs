//! The output filter: cutting the selected rows out of the probe side's
//! batches on the host's copy threads, into output batches of about
//! [`OUTPUT_BATCH_ROWS`] rows; fixed-width columns are written straight into
//! one (pinned, when a device exists) buffer per chunk, and a key column can
//! come back from the device instead of being filtered.
//!
//! The output streams: [`plan_partitions`] cuts each partition's input batches
//! into [`Chunk`]s of consecutive output groups, and the partition's stream
//! ([`stream_chunks`]) filters one chunk at a time (the next one ahead, on
//! tokio's blocking pool), each chunk's groups in parallel on the copy
//! threads. A chunk's input batches are released, and the partition's memory
//! reservation shrunk by their bytes, once its output batches are built; each
//! output batch's bytes are reserved until the stream returns it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use datafusion::arrow::array::{make_array, ArrayData, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions};
use datafusion::arrow::buffer::{BooleanBuffer, Buffer};
use datafusion::arrow::compute::BatchCoalescer;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_plan::metrics::Time;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};

use crate::gpu::{self};

use super::memory::{batch_bytes, slice_bytes};

/// Output batches aim at this many rows (or the session's batch size, if
/// larger): every batch costs a cross-thread hand-off in the operators above
/// (CoalescePartitionsExec under `collect`), measured at ~13 us per batch on
/// the GPU machine, 20 ms for the 1536 batches of a 100M-row input.
pub(crate) const OUTPUT_BATCH_ROWS: usize = 1 << 17;
/// At most this many input rows go into one output batch (one task), so
/// sparse selections still spread over the copy threads.
pub(crate) const GROUP_INPUT_ROWS: usize = 1 << 20;

/// Columns of `rows` rows each (in `schema`'s order; none, for rows without
/// columns) as `partitions` partitions of consecutive rows, each in batches of
/// [`OUTPUT_BATCH_ROWS`] rows (slices of the columns, no copy): the output of
/// an operator whose rows the device decoded (`DeviceScanExec` payloads).
pub(crate) fn consecutive_batches(
    schema: &SchemaRef,
    columns: &[ArrayRef],
    rows: usize,
    partitions: usize,
) -> Result<Vec<Vec<RecordBatch>>> {
    if columns.iter().any(|a| a.len() != rows) {
        return Err(DataFusionError::Internal(format!("consecutive_batches: a column not of {rows} rows")));
    }
    let partitions = partitions.max(1);
    let per = rows.div_ceil(partitions).max(1);
    (0..partitions)
        .map(|p| {
            let (start, end) = ((p * per).min(rows), ((p + 1) * per).min(rows));
            (start..end)
                .step_by(OUTPUT_BATCH_ROWS)
                .map(|at| {
                    let len = OUTPUT_BATCH_ROWS.min(end - at);
                    let sliced = columns.iter().map(|a| a.slice(at, len)).collect();
                    let options = RecordBatchOptions::new().with_row_count(Some(len));
                    Ok(RecordBatch::try_new_with_options(schema.clone(), sliced, &options)?)
                })
                .collect()
        })
        .collect()
}

/// How the output is formed, for one execution.
pub(crate) struct OutputSpec {
    /// The probe side's output columns.
    pub(crate) columns: OutputColumns,
    /// A column (probe side index) whose kept values came back from the
    /// device, in row order, as 64-bit values of its own type: the host slices
    /// them instead of reading and filtering that column, when they are as
    /// many as the kept rows.
    pub(crate) key_column: Option<(usize, gpu::PendingBuffer)>,
    pub(crate) batch_size: usize,
    /// The device whose pinned pool holds fixed-width output columns.
    pub(crate) out_mem: Option<Arc<gpu::Gpu>>,
    pub(crate) ran: Arc<Mutex<Option<String>>>,
    pub(crate) filter_time: Time,
}

/// One partition's output, as its stream produces it.
pub(crate) enum PartitionOutput {
    /// No column is output: only the number of kept rows.
    Rows(usize),
    /// Chunks of output batches to filter, and the reservation of their input batches' bytes.
    Chunks { chunks: Vec<Chunk>, reservation: MemoryReservation },
    /// The output batches themselves (the kept rows' columns came from the device).
    Batches(Vec<RecordBatch>),
}

/// What the chunks of one execution share.
pub(crate) struct OutputShared {
    columns: Vec<usize>,
    key: Option<DeviceKeys>,
    out_mem: Option<Arc<gpu::Gpu>>,
    /// Cleared once pinned output memory failed: host memory from then on.
    pinned_ok: AtomicBool,
    ran: Arc<Mutex<Option<String>>>,
    filter_time: Time,
    /// The bytes of the selection and of the device's kept keys, which every
    /// chunk reads: released with the last chunk.
    _reservation: MemoryReservation,
}

/// The device's kept keys of one output column: waited for once, by the first chunk that needs them.
struct DeviceKeys {
    column: usize,
    pending: Mutex<Option<gpu::PendingBuffer>>,
    ready: OnceLock<Option<Buffer>>,
}

impl OutputShared {
    /// The device's kept keys, waiting for them the first time; None when they did not come.
    fn device_keys(&self) -> Option<&Buffer> {
        let k = self.key.as_ref()?;
        k.ready
            .get_or_init(|| {
                let pending = k.pending.lock().unwrap_or_else(|e| e.into_inner()).take()?;
                // Device trouble never fails the query: the host filters that column too.
                let keys = pending.wait().ok()?;
                if let Some(ran) = self.ran.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                    ran.push_str(", key column from device");
                }
                Some(keys)
            })
            .as_ref()
    }

    /// The output columns the host filters: all but a key column the device sends (unless it failed).
    fn host_columns(&self) -> Vec<usize> {
        match &self.key {
            Some(k) if k.ready.get().is_none_or(|r| r.is_some()) => {
                self.columns.iter().copied().filter(|&c| c != k.column).collect()
            }
            _ => self.columns.clone(),
        }
    }

    /// Whether the key column came from the device.
    #[cfg(test)]
    fn keys_used(&self) -> bool {
        self.key.as_ref().is_some_and(|k| matches!(k.ready.get(), Some(Some(_))))
    }
}

/// Consecutive output groups of one partition, with the input batches they
/// read (owned: released when the chunk's output is built).
pub(crate) struct Chunk {
    batches: Vec<RecordBatch>,
    /// Each batch's first row in the selection.
    first_rows: Vec<usize>,
    /// Each batch's kept rows.
    kept: Vec<usize>,
    /// Groups over `batches` (`kept_before`: kept rows of every partition before the group).
    groups: Vec<Group>,
    /// The reserved bytes of `batches`.
    input_bytes: usize,
    selection: BooleanBuffer,
    shared: Arc<OutputShared>,
}

/// Output groups per chunk: one per copy thread, so that a chunk keeps them busy.
fn chunk_groups() -> usize {
    crate::host::copy_threads().max(1)
}

/// Plan the output of every partition of the probe side (`parts`, whose bytes
/// `inputs` holds, as [`batch_bytes`] counts them): count each batch's kept
/// rows (on the copy threads), form output groups of consecutive batches of
/// about [`OUTPUT_BATCH_ROWS`] kept rows (arrow's `BatchCoalescer` copies kept
/// rows straight into the output, so no extra copy is made to form large
/// batches), cut them into chunks, and split each partition's input bytes off
/// `inputs` into its own reservation. `shared`: the reservation of the
/// selection's and the device keys' bytes, released with the last chunk.
pub(crate) fn plan_partitions(
    parts: Vec<Vec<RecordBatch>>,
    selection: &BooleanBuffer,
    spec: OutputSpec,
    inputs: &MemoryReservation,
    shared: MemoryReservation,
) -> Result<Vec<PartitionOutput>> {
    let mut flat = Vec::new();
    let mut at = 0;
    for (p, batches) in parts.iter().enumerate() {
        for b in batches {
            flat.push(InputBatch { partition: p, batch: b, first_row: at });
            at += b.num_rows();
        }
    }
    // Counted on the selection's bytes: a BooleanBuffer slice per batch would
    // bump one shared reference count from every thread (3.6 ms for 12,288 batches).
    let (bits, bits_at) = (selection.inner(), selection.offset());
    let kept: Vec<usize> = crate::host::par_map(&flat, 256, |b| {
        Ok::<_, DataFusionError>(bits.count_set_bits_offset(bits_at + b.first_row, b.batch.num_rows()))
    })?;
    crate::util::trace("filter: kept rows counted");
    if spec.columns == OutputColumns::RowCount {
        let mut rows = vec![0; parts.len()];
        flat.iter().zip(&kept).for_each(|(b, k)| rows[b.partition] += k);
        drop(flat);
        crate::host::drop_later(parts);
        return Ok(rows.into_iter().map(PartitionOutput::Rows).collect());
    }
    let columns: Vec<usize> = match &spec.columns {
        OutputColumns::Columns(c) => c.clone(),
        _ => (0..flat.first().map_or(0, |f| f.batch.num_columns())).collect(),
    };
    // The device's kept keys stand in for the key column only if they cover every kept row.
    let total: usize = kept.iter().sum();
    let key = spec.key_column.filter(|(c, keys)| columns.contains(c) && keys.len() == total * 8);
    // Groups of consecutive batches of one partition.
    let target = OUTPUT_BATCH_ROWS.max(spec.batch_size);
    let mut groups: Vec<Group> = Vec::new();
    let (mut input_rows, mut before) = (0usize, 0usize);
    for (i, (b, &k)) in flat.iter().zip(&kept).enumerate() {
        match groups.last_mut() {
            Some(g) if g.partition == b.partition && g.kept_rows < target && input_rows < GROUP_INPUT_ROWS => {
                g.end = i + 1;
                g.kept_rows += k;
                input_rows += b.batch.num_rows();
            }
            _ => {
                groups.push(Group { partition: b.partition, first: i, end: i + 1, kept_rows: k, kept_before: before });
                input_rows = b.batch.num_rows();
            }
        }
        before += k;
    }
    let first_rows: Vec<usize> = flat.iter().map(|b| b.first_row).collect();
    drop(flat);
    let shared = Arc::new(OutputShared {
        columns,
        key: key.map(|(column, pending)| DeviceKeys {
            column,
            pending: Mutex::new(Some(pending)),
            ready: OnceLock::new(),
        }),
        out_mem: spec.out_mem,
        pinned_ok: AtomicBool::new(true),
        ran: spec.ran,
        filter_time: spec.filter_time,
        _reservation: shared,
    });
    // Cut each partition's groups into chunks that own their batches.
    let mut outputs: Vec<(Vec<Chunk>, usize)> = parts.iter().map(|_| (Vec::new(), 0)).collect();
    let mut batches = parts.into_iter().flatten();
    let mut next_batch = 0;
    for run in groups.chunk_by(|a, b| a.partition == b.partition) {
        for chunk in run.chunks(chunk_groups()) {
            let (first, end) = (chunk[0].first, chunk[chunk.len() - 1].end);
            // Batches before `first` belong to partitions without groups: none (every batch is in a group).
            debug_assert_eq!(first, next_batch);
            let owned: Vec<RecordBatch> = batches.by_ref().take(end - next_batch).collect();
            next_batch = end;
            let input_bytes = owned.iter().map(batch_bytes).sum();
            let (chunks, bytes) = &mut outputs[chunk[0].partition];
            *bytes += input_bytes;
            chunks.push(Chunk {
                batches: owned,
                first_rows: first_rows[first..end].to_vec(),
                kept: kept[first..end].to_vec(),
                groups: chunk.iter().map(|g| Group { first: g.first - first, end: g.end - first, ..*g }).collect(),
                input_bytes,
                selection: selection.clone(),
                shared: shared.clone(),
            });
        }
    }
    Ok(outputs
        .into_iter()
        .map(|(chunks, bytes)| PartitionOutput::Chunks { chunks, reservation: inputs.split(bytes.min(inputs.size())) })
        .collect())
}

/// A partition's output batches, filtered chunk by chunk (one chunk ahead)
/// off the async runtime, the filtering counted in `elapsed_compute`;
/// `reservation` holds the chunks' input bytes.
pub(crate) fn stream_chunks(
    chunks: Vec<Chunk>,
    reservation: MemoryReservation,
    elapsed_compute: Time,
) -> BoxStream<'static, Result<RecordBatch>> {
    let reservation = Arc::new(reservation);
    let r = reservation.clone();
    futures::stream::iter(chunks)
        .map(move |c| {
            let (r, elapsed_compute) = (r.clone(), elapsed_compute.clone());
            super::off_runtime(move || {
                let _timer = elapsed_compute.timer();
                c.filter(&r)
            })
        })
        .buffered(2)
        .map_ok(move |batches| {
            let r = reservation.clone();
            futures::stream::iter(batches.into_iter().map(move |(b, bytes)| {
                // The batch is the caller's from here on.
                let _ = r.try_shrink(bytes);
                Ok(b)
            }))
        })
        .try_flatten()
        .boxed()
}

/// A group's host-filtered output: the batch's schema and its host columns (None: nothing kept).
type Filtered = Option<(SchemaRef, Option<RecordBatch>)>;

impl Chunk {
    /// The chunk's output batches, each with its reserved bytes: grows
    /// `reservation` by them, then releases the chunk's input batches and
    /// shrinks it by their bytes.
    pub(crate) fn filter(self, reservation: &MemoryReservation) -> Result<Vec<(RecordBatch, usize)>> {
        let t = Instant::now();
        let Chunk { batches, first_rows, kept, groups, input_bytes, selection, shared } = self;
        let flat: Vec<InputBatch<'_>> = batches
            .iter()
            .zip(&first_rows)
            .map(|(b, &first_row)| InputBatch { partition: 0, batch: b, first_row })
            .collect();
        let columns = &shared.columns;
        let mut host_columns = shared.host_columns();
        let mut filtered = filter_groups(&shared, &flat, &kept, &selection, &groups, &host_columns)?;
        let keys = match shared.key.as_ref().map(|k| k.column) {
            Some(k) if !host_columns.contains(&k) => match shared.device_keys() {
                Some(keys) => Some((k, keys)),
                None => {
                    // The keys did not come: the host filters that column too.
                    host_columns = columns.clone();
                    filtered = filter_groups(&shared, &flat, &kept, &selection, &groups, &host_columns)?;
                    None
                }
            },
            _ => None,
        };
        let mut out = Vec::with_capacity(groups.len());
        for (&Group { kept_rows: rows, kept_before: before, .. }, r) in groups.iter().zip(filtered) {
            let Some((schema, host)) = r else { continue };
            let arrays: Vec<ArrayRef> = columns
                .iter()
                .enumerate()
                .map(|(j, c)| match (&keys, &host) {
                    (Some((k, keys)), _) if k == c => {
                        let data = ArrayData::builder(schema.field(j).data_type().clone())
                            .len(rows)
                            .add_buffer(keys.slice_with_length(before * 8, rows * 8))
                            .build()?;
                        Ok(make_array(data))
                    }
                    (_, Some(h)) => Ok(h.column(host_columns.iter().position(|x| x == c).unwrap_or(0)).clone()),
                    _ => Err(DataFusionError::Internal("setfusion: output column missing".into())),
                })
                .collect::<Result<_>>()?;
            let options = RecordBatchOptions::new().with_row_count(Some(rows));
            let batch = RecordBatch::try_new_with_options(schema, arrays, &options)?;
            let bytes = slice_bytes(&batch);
            out.push((batch, bytes));
        }
        reservation.try_grow(out.iter().map(|(_, n)| n).sum())?;
        drop(flat);
        crate::host::drop_later(batches);
        let _ = reservation.try_shrink(input_bytes);
        shared.filter_time.add_duration(t.elapsed());
        Ok(out)
    }
}

/// The host's columns of each group's output batch, filtered in parallel on
/// the copy threads; fixed-width columns without NULLs go into one pinned
/// buffer from the device's pool (resident pages, reused across queries)
/// when there is a device.
fn filter_groups(
    shared: &OutputShared,
    flat: &[InputBatch<'_>],
    kept: &[usize],
    selection: &BooleanBuffer,
    groups: &[Group],
    host_columns: &[usize],
) -> Result<Vec<Filtered>> {
    let columns = &shared.columns;
    let widths = fixed_widths(flat, kept, host_columns);
    let pinned_hosts = match (&shared.out_mem, &widths) {
        (Some(g), Some(widths)) if shared.pinned_ok.load(Ordering::Relaxed) => {
            // The pinned buffer holds this chunk's groups only.
            let base = groups.first().map_or(0, |g| g.kept_before);
            let local: Vec<Group> = groups.iter().map(|g| Group { kept_before: g.kept_before - base, ..*g }).collect();
            let total = local.iter().map(|g| g.kept_rows).sum();
            match filter_fixed_width_pinned(g, flat, kept, selection, &local, host_columns, widths, total) {
                Ok(hosts) => Some(hosts),
                Err(_) => {
                    // Device trouble (pinned output memory) never fails the query: host memory from now on.
                    shared.pinned_ok.store(false, Ordering::Relaxed);
                    None
                }
            }
        }
        _ => None,
    };
    let mut results: Vec<Option<Result<Filtered>>> = groups.iter().map(|_| None).collect();
    crate::host::for_each_mut(&mut results, &|g, slot| {
        let Group { first, end, kept_rows: rows, .. } = groups[g];
        let run = || -> Result<Filtered> {
            if rows == 0 {
                return Ok(None);
            }
            // The batches' own schema (nullability as produced), not the plan's.
            let schema = Arc::new(flat[first].batch.schema().project(columns)?);
            if let Some(hosts) = &pinned_hosts {
                return Ok(Some((schema, hosts[g].clone())));
            }
            if let Some(widths) = &widths {
                let batches = group_batches(flat, kept, selection, first, end);
                return Ok(Some((schema, Some(filter_fixed_width(&batches, host_columns, widths, rows)?))));
            }
            let mut out: Option<BatchCoalescer> = None;
            for i in first..end {
                let InputBatch { batch: b, first_row: at, .. } = flat[i];
                let n = b.num_rows();
                if kept[i] == 0 || host_columns.is_empty() {
                    continue;
                }
                let b = b.project(host_columns)?;
                let out = out.get_or_insert_with(|| BatchCoalescer::new(b.schema(), rows));
                if kept[i] == n {
                    out.push_batch(b)?;
                } else {
                    out.push_batch_with_filter(b, &BooleanArray::new(selection.slice(at, n), None))?;
                }
            }
            let host = match out {
                Some(mut out) => {
                    out.finish_buffered_batch()?;
                    out.next_completed_batch()
                }
                None => None,
            };
            Ok(Some((schema, host)))
        };
        *slot = Some(run());
    });
    results.into_iter().map(|r| r.expect("for_each_mut runs every task")).collect()
}

/// Every partition's output, filtered in place (tests): the batches per
/// partition, and whether the device's key column was used.
#[cfg(test)]
pub(crate) fn filter_all(
    parts: &[Vec<RecordBatch>],
    selection: &BooleanBuffer,
    columns: &OutputColumns,
    key_column: Option<(usize, gpu::PendingBuffer)>,
    batch_size: usize,
    out_mem: Option<Arc<gpu::Gpu>>,
) -> Result<(Vec<Vec<RecordBatch>>, bool)> {
    use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, UnboundedMemoryPool};
    let pool: Arc<dyn MemoryPool> = Arc::new(UnboundedMemoryPool::default());
    let inputs = MemoryConsumer::new("test").register(&pool);
    inputs.grow(parts.iter().flatten().map(batch_bytes).sum());
    let spec = OutputSpec {
        columns: columns.clone(),
        key_column,
        batch_size,
        out_mem,
        ran: Arc::new(Mutex::new(None)),
        filter_time: Time::new(),
    };
    let outputs = plan_partitions(parts.to_vec(), selection, spec, &inputs, inputs.new_empty())?;
    let mut used = false;
    let mut all = Vec::new();
    for o in outputs {
        let PartitionOutput::Chunks { chunks, reservation } = o else {
            return Err(DataFusionError::Internal("batches expected".into()));
        };
        let mut batches = Vec::new();
        for c in chunks {
            let shared = c.shared.clone();
            batches.extend(c.filter(&reservation)?.into_iter().map(|(b, _)| b));
            used |= shared.keys_used();
        }
        all.push(batches);
    }
    Ok((all, used))
}

/// A batch's bits of the selection: the selection's bytes and the bit offset
/// of the batch's first row (no BooleanBuffer per batch: see `plan_partitions`).
pub(crate) type KeptBits<'a> = (&'a [u8], usize);

/// The batches `first..end` of `flat` that keep rows, each with its bits of the selection.
fn group_batches<'a>(
    flat: &[InputBatch<'a>],
    kept: &[usize],
    selection: &'a BooleanBuffer,
    first: usize,
    end: usize,
) -> Vec<(&'a RecordBatch, KeptBits<'a>)> {
    (first..end)
        .filter(|&i| kept[i] > 0)
        .map(|i| (flat[i].batch, (selection.values(), selection.offset() + flat[i].first_row)))
        .collect()
}

/// The kept rows of `columns` of `batches` (each with its selection) as one
/// batch of `rows` rows, the columns being fixed-width primitives of byte
/// `widths` (see [`fixed_widths`]): kept values are copied straight into one
/// output buffer per column. (`BatchCoalescer` filters a batch that keeps
/// more than 1/16 of its rows into a temporary batch first and copies that
/// again.)
fn filter_fixed_width(
    batches: &[(&RecordBatch, KeptBits<'_>)],
    columns: &[usize],
    widths: &[usize],
    rows: usize,
) -> Result<RecordBatch> {
    let Some((first, _)) = batches.first() else {
        return Err(DataFusionError::Internal("setfusion: no batch to filter".into()));
    };
    let mut arrays = Vec::with_capacity(columns.len());
    for (&c, &w) in columns.iter().zip(widths) {
        let values = if w == 8 { kept_values::<u64>(batches, c, rows) } else { kept_values::<u32>(batches, c, rows) };
        let data = ArrayData::builder(first.column(c).data_type().clone()).len(rows).add_buffer(values).build()?;
        arrays.push(make_array(data));
    }
    let schema = Arc::new(first.schema().project(columns)?);
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(schema, arrays, &options)?)
}

/// The byte widths of `columns` when every one is a fixed-width 4- or 8-byte
/// primitive of one type without NULLs in every batch with kept rows.
fn fixed_widths(flat: &[InputBatch<'_>], kept: &[usize], columns: &[usize]) -> Option<Vec<usize>> {
    let first = flat.iter().zip(kept).find(|(_, k)| **k > 0)?.0.batch;
    if columns.is_empty() {
        return None;
    }
    columns
        .iter()
        .map(|&c| {
            let dt = first.column(c).data_type().clone();
            let w = dt.primitive_width().filter(|w| *w == 4 || *w == 8)?;
            flat.iter()
                .zip(kept)
                .filter(|(_, k)| **k > 0)
                .all(|(InputBatch { batch: b, .. }, _)| {
                    // (Primitive values are aligned by construction: ScalarBuffer checks it.)
                    let a = b.column(c);
                    a.data_type() == &dt && a.logical_null_count() == 0
                })
                .then_some(w)
        })
        .collect()
}

/// Every group's kept rows of the fixed-width `columns` (see [`fixed_widths`]),
/// written straight into one pinned host buffer (`Gpu::host_output`): one
/// region per column, one slice per group in it. Returns each group's batch of
/// those columns (None for groups that keep nothing).
#[allow(clippy::too_many_arguments)]
fn filter_fixed_width_pinned(
    g: &gpu::Gpu,
    flat: &[InputBatch<'_>],
    kept: &[usize],
    selection: &BooleanBuffer,
    groups: &[Group],
    columns: &[usize],
    widths: &[usize],
    total: usize,
) -> Result<Vec<Option<RecordBatch>>> {
    let region: Vec<usize> = widths.iter().map(|w| (total * w).next_multiple_of(64)).collect();
    let bytes: usize = region.iter().sum();
    let mut out = g.host_output(bytes)?;
    crate::util::trace("filter: pinned output buffer ready");
    let mut rest = &mut out.as_mut_slice()?[..bytes];
    // slices[g][j]: group g's part of column j's region.
    let mut slices: Vec<Vec<&mut [u8]>> = groups.iter().map(|_| Vec::new()).collect();
    for (j, w) in widths.iter().enumerate() {
        let (col, tail) = std::mem::take(&mut rest).split_at_mut(region[j]);
        rest = tail;
        let mut col = col;
        for (gi, grp) in groups.iter().enumerate() {
            let (mine, tail) = std::mem::take(&mut col).split_at_mut(grp.kept_rows * w);
            slices[gi].push(mine);
            col = tail;
        }
    }
    crate::host::for_each_mut(&mut slices, &|gi, dsts| {
        let Group { first, end, .. } = groups[gi];
        let batches = group_batches(flat, kept, selection, first, end);
        for ((&c, &w), dst) in columns.iter().zip(widths).zip(dsts.iter_mut()) {
            if w == 8 {
                write_kept::<u64>(&batches, c, dst);
            } else {
                write_kept::<u32>(&batches, c, dst);
            }
        }
    });
    drop(slices);
    let buffer = out.into_buffer(bytes)?;
    let Some(first) = flat.iter().zip(kept).find(|(_, k)| **k > 0).map(|(f, _)| f.batch) else {
        return Ok(groups.iter().map(|_| None).collect());
    };
    let schema = Arc::new(first.schema().project(columns)?);
    groups
        .iter()
        .map(|&Group { kept_rows: rows, kept_before: before, .. }| {
            if rows == 0 {
                return Ok(None);
            }
            let mut at = 0;
            let arrays = columns
                .iter()
                .zip(widths)
                .enumerate()
                .map(|(j, (&c, &w))| {
                    let data = ArrayData::builder(first.column(c).data_type().clone())
                        .len(rows)
                        .add_buffer(buffer.slice_with_length(at + before * w, rows * w))
                        .build()?;
                    at += region[j];
                    Ok(make_array(data))
                })
                .collect::<Result<Vec<ArrayRef>>>()?;
            let options = RecordBatchOptions::new().with_row_count(Some(rows));
            Ok(Some(RecordBatch::try_new_with_options(schema.clone(), arrays, &options)?))
        })
        .collect()
}

/// Call `f` with every value of `values` whose bit in `mask` (bytes, bit
/// offset of the first value) is set, in order, one 64-bit mask word at a
/// time. The one loop behind the fixed-width output paths (and `setfusion
/// bench filter`).
pub fn for_each_kept<T: Copy>(values: &[T], mask: KeptBits<'_>, mut f: impl FnMut(T)) {
    let chunks = datafusion::arrow::util::bit_chunk_iterator::BitChunks::new(mask.0, mask.1, values.len());
    let mut word = |base: usize, mut m: u64| {
        while m != 0 {
            f(values[base + m.trailing_zeros() as usize]);
            m &= m - 1;
        }
    };
    for (w, bits) in chunks.iter().enumerate() {
        word(w * 64, bits);
    }
    word(chunks.chunk_len() * 64, chunks.remainder_bits());
}

/// Column `c` (fixed width `T`, aligned, no NULLs) of a batch as a slice.
fn fixed_values<T: datafusion::arrow::datatypes::ArrowNativeType>(
    b: &RecordBatch,
    c: usize,
) -> datafusion::arrow::buffer::ScalarBuffer<T> {
    let data = b.column(c).to_data();
    datafusion::arrow::buffer::ScalarBuffer::<T>::new(data.buffers()[0].clone(), data.offset(), data.len())
}

/// Write the kept values of column `c` (fixed width `T`, aligned, no NULLs) of every batch, in order, into `dst`.
fn write_kept<T: datafusion::arrow::datatypes::ArrowNativeType>(
    batches: &[(&RecordBatch, KeptBits<'_>)],
    c: usize,
    dst: &mut [u8],
) {
    use datafusion::arrow::datatypes::ToByteSlice;
    let mut slots = dst.chunks_exact_mut(std::mem::size_of::<T>());
    for &(b, mask) in batches {
        for_each_kept(&fixed_values::<T>(b, c), mask, |v: T| {
            if let Some(slot) = slots.next() {
                slot.copy_from_slice(v.to_byte_slice());
            }
        });
    }
}

/// The kept values of column `c` (fixed width `T`, aligned, no NULLs) of every batch, in order.
fn kept_values<T: datafusion::arrow::datatypes::ArrowNativeType>(
    batches: &[(&RecordBatch, KeptBits<'_>)],
    c: usize,
    rows: usize,
) -> datafusion::arrow::buffer::Buffer {
    let mut out: Vec<T> = Vec::with_capacity(rows);
    for &(b, mask) in batches {
        for_each_kept(&fixed_values::<T>(b, c), mask, |v| out.push(v));
    }
    datafusion::arrow::buffer::Buffer::from_vec(out)
}

/// Which of the probe side's columns the output carries.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum OutputColumns {
    /// None: only each partition's row count is output (e.g. under `count(*)`).
    RowCount,
    /// Every column.
    All,
    /// These columns, in this order.
    Columns(Vec<usize>),
}

/// One input batch of the probe side, with its partition and the selection
/// bit of its first row.
#[derive(Clone, Copy)]
struct InputBatch<'a> {
    partition: usize,
    batch: &'a RecordBatch,
    first_row: usize,
}

/// Consecutive input batches `first..end` of one partition that make one
/// output batch of `kept_rows` rows, `kept_before` kept rows preceding it.
#[derive(Clone, Copy)]
struct Group {
    partition: usize,
    first: usize,
    end: usize,
    kept_rows: usize,
    kept_before: usize,
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryConsumer, MemoryPool};

    use super::*;

    /// The output streams: when the first batch is returned, the later
    /// chunks' input batches are still held (reserved) and their output is
    /// not built; at no point are all outputs held beside all inputs; every
    /// byte goes back to the pool at the end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn output_streams_chunk_by_chunk() {
        let schema = Arc::new(Schema::new(vec![Field::new("k", DataType::Int64, false)]));
        let batch_rows = 1 << 16;
        // Two batches per output group, four chunks or more.
        let batches = 2 * chunk_groups() * 4;
        let part: Vec<RecordBatch> = (0..batches)
            .map(|b| {
                let k = Int64Array::from_iter_values((0..batch_rows as i64).map(|i| i + (b * batch_rows) as i64));
                RecordBatch::try_new(schema.clone(), vec![Arc::new(k)]).unwrap()
            })
            .collect();
        let rows = batches * batch_rows;
        let selection = BooleanBuffer::new_set(rows);
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(1 << 40));
        let inputs = MemoryConsumer::new("test").register(&pool);
        let input_bytes: usize = part.iter().map(batch_bytes).sum();
        inputs.grow(input_bytes);
        let spec = OutputSpec {
            columns: OutputColumns::All,
            key_column: None,
            batch_size: 8192,
            out_mem: None,
            ran: Arc::new(Mutex::new(None)),
            filter_time: Time::new(),
        };
        let mut outputs = plan_partitions(vec![part], &selection, spec, &inputs, inputs.new_empty()).unwrap();
        inputs.free();
        assert_eq!(pool.reserved(), input_bytes);
        let Some(PartitionOutput::Chunks { chunks, reservation }) = outputs.pop() else { panic!("chunks expected") };
        let n_chunks = chunks.len();
        assert!(n_chunks >= 4, "{n_chunks} chunks");
        let mut stream = stream_chunks(chunks, reservation, Time::new());
        let first = stream.next().await.unwrap().unwrap();
        let output_bytes = input_bytes; // every row is kept
        let after_first = pool.reserved();
        // At most two chunks are filtered (one ahead): the rest of the input is still reserved, its output not built.
        let chunk_bytes = input_bytes / n_chunks;
        assert!(after_first >= input_bytes - 2 * chunk_bytes, "{after_first} of {input_bytes}");
        assert!(after_first <= input_bytes + 2 * chunk_bytes, "{after_first}: more than two chunks' output held");
        let (mut out_rows, mut peak) = (first.num_rows(), after_first);
        while let Some(b) = stream.next().await {
            out_rows += b.unwrap().num_rows();
            peak = peak.max(pool.reserved());
        }
        assert_eq!(out_rows, rows);
        assert!(peak < input_bytes + output_bytes / 2 + chunk_bytes, "peak {peak}: outputs held beside inputs");
        drop(stream);
        assert_eq!(pool.reserved(), 0);
    }
}
