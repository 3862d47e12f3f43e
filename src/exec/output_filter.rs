//! The output filter: cutting the selected rows out of the probe side's
//! batches on the host's copy threads, into output batches of about
//! [`OUTPUT_BATCH_ROWS`] rows; fixed-width columns are written straight into
//! one (pinned, when a device exists) buffer, and a key column can come back
//! from the device instead of being filtered.

use std::sync::Arc;

use datafusion::arrow::array::{make_array, ArrayData, ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::arrow::compute::BatchCoalescer;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::error::{DataFusionError, Result};

use crate::gpu::{self};


/// Output batches aim at this many rows (or the session's batch size, if
/// larger): every batch costs a cross-thread hand-off in the operators above
/// (CoalescePartitionsExec under `collect`), measured at ~13 us per batch on
/// the GPU machine, 20 ms for the 1536 batches of a 100M-row input.
pub(crate) const OUTPUT_BATCH_ROWS: usize = 1 << 17;
/// At most this many input rows go into one output batch (one task), so
/// sparse selections still spread over the copy threads.
pub(crate) const GROUP_INPUT_ROWS: usize = 1 << 20;
/// Cut the kept rows out of every partition (`projection` applied first, so
/// only output columns are read), on the copy threads, all partitions at
/// once: partitions filtering in their own streams were measured to serialise
/// on the runtime (a woken partition can wait in a busy worker's queue for a
/// whole partition's filtering: 20 ms of 100 on 100M rows). Consecutive input
/// batches of a partition are filtered into one output batch of about
/// [`OUTPUT_BATCH_ROWS`] rows (arrow's `BatchCoalescer` copies kept rows
/// straight into the output), so no extra copy is made to form large batches.
/// `columns`: the probe side's output columns. `key_column`: a column
/// (kept side index) whose kept values came back from the device, in row
/// order, as 64-bit values of its own type: the host slices them instead of
/// reading and filtering that column, when they are as many as the kept rows.
/// Returns the outputs and whether that key column was used.
pub(crate) fn filter_partitions(
    parts: &[Vec<RecordBatch>],
    selection: &BooleanBuffer,
    columns: &OutputColumns,
    key_column: Option<(usize, gpu::PendingBuffer)>,
    batch_size: usize,
    out_mem: Option<&gpu::Gpu>,
) -> Result<(Vec<Output>, bool)> {
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
    let kept: Vec<usize> =
        crate::gpu::par_map(&flat, 256, |b| Ok::<_, DataFusionError>(bits.count_set_bits_offset(bits_at + b.first_row, b.batch.num_rows())))?;
    crate::util::trace("filter: kept rows counted");
    if *columns == OutputColumns::RowCount {
        let mut rows = vec![0; parts.len()];
        flat.iter().zip(&kept).for_each(|(b, k)| rows[b.partition] += k);
        return Ok((rows.into_iter().map(Output::Rows).collect(), false));
    }
    let Some(first) = flat.first() else { return Ok((parts.iter().map(|_| Output::Batches(Vec::new())).collect(), false)) };
    let columns: Vec<usize> = match columns {
        OutputColumns::Columns(c) => c.clone(),
        _ => (0..first.batch.num_columns()).collect(),
    };
    // Output columns filtered on the host (all but a key column from the device).
    // The device's kept keys stand in for the key column only if they cover every kept row.
    let total: usize = kept.iter().sum();
    let key_column = key_column.filter(|(c, keys)| columns.contains(c) && keys.len() == total * 8);
    let from_device = key_column.is_some();
    let host_columns: Vec<usize> = columns.iter().copied().filter(|&c| key_column.as_ref().is_none_or(|(k, _)| c != *k)).collect();
    // Groups of consecutive batches of one partition.
    let target = OUTPUT_BATCH_ROWS.max(batch_size);
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
    // Fixed-width host columns without NULLs land in one pinned buffer from the
    // device's pool (resident pages, reused across queries) when there is a device.
    let widths = fixed_widths(&flat, &kept, &host_columns);
    crate::util::trace("filter: groups formed, widths checked");
    let pinned_hosts = match (out_mem, &widths) {
        (Some(g), Some(widths)) => Some(filter_fixed_width_pinned(g, &flat, &kept, selection, &groups, &host_columns, widths, before)?),
        _ => None,
    };
    crate::util::trace("filter: pinned columns written");
    // The host's columns of each group's output batch, filtered in parallel
    // while the device's keys are still on their way.
    type Filtered = Result<Option<(SchemaRef, Option<RecordBatch>)>>;
    let mut results: Vec<Option<Filtered>> = groups.iter().map(|_| None).collect();
    crate::gpu::for_each_mut(&mut results, &|g, slot| {
        let Group { first, end, kept_rows: rows, .. } = groups[g];
        let run = || -> Filtered {
            if rows == 0 {
                return Ok(None);
            }
            // The batches' own schema (nullability as produced), not the plan's.
            let schema = Arc::new(flat[first].batch.schema().project(&columns)?);
            if let Some(hosts) = &pinned_hosts {
                return Ok(Some((schema, hosts[g].clone())));
            }
            if let Some(widths) = &widths {
                let batches = group_batches(flat.as_slice(), &kept, selection, first, end);
                return Ok(Some((schema, Some(filter_fixed_width(&batches, &host_columns, widths, rows)?))));
            }
            let mut out: Option<BatchCoalescer> = None;
            for i in first..end {
                let InputBatch { batch: b, first_row: at, .. } = flat[i];
                let n = b.num_rows();
                if kept[i] == 0 || host_columns.is_empty() {
                    continue;
                }
                let b = b.project(&host_columns)?;
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
    crate::util::trace("filter: group batches formed");
    let key_column = match key_column {
        Some((c, pending)) => Some((c, pending.wait()?)),
        None => None,
    };
    let mut outputs: Vec<Vec<RecordBatch>> = parts.iter().map(|_| Vec::new()).collect();
    for (&Group { partition: p, kept_rows: rows, kept_before: before, .. }, r) in groups.iter().zip(results) {
        let Some((schema, host)) = r.expect("for_each_mut runs every task")? else { continue };
        let arrays: Vec<ArrayRef> = columns
            .iter()
            .enumerate()
            .map(|(j, c)| match (&key_column, &host) {
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
        outputs[p].push(RecordBatch::try_new_with_options(schema, arrays, &options)?);
    }
    Ok((outputs.into_iter().map(Output::Batches).collect(), from_device))
}

/// A batch's bits of the selection: the selection's bytes and the bit offset
/// of the batch's first row (no BooleanBuffer per batch: see `filter_partitions`).
pub(crate) type KeptBits<'a> = (&'a [u8], usize);

/// The batches `first..end` of `flat` that keep rows, each with its bits of the selection.
fn group_batches<'a>(
    flat: &[InputBatch<'a>],
    kept: &[usize],
    selection: &'a BooleanBuffer,
    first: usize,
    end: usize,
) -> Vec<(&'a RecordBatch, KeptBits<'a>)> {
    (first..end).filter(|&i| kept[i] > 0).map(|i| (flat[i].batch, (selection.values(), selection.offset() + flat[i].first_row))).collect()
}

/// The kept rows of `columns` of `batches` (each with its selection) as one
/// batch of `rows` rows, the columns being fixed-width primitives of byte
/// `widths` (see [`fixed_widths`]): kept values are copied straight into one
/// output buffer per column. (`BatchCoalescer` filters a batch that keeps
/// more than 1/16 of its rows into a temporary batch first and copies that
/// again.)
fn filter_fixed_width(batches: &[(&RecordBatch, KeptBits<'_>)], columns: &[usize], widths: &[usize], rows: usize) -> Result<RecordBatch> {
    let Some((first, _)) = batches.first() else { return Err(DataFusionError::Internal("setfusion: no batch to filter".into())) };
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
    crate::gpu::for_each_mut(&mut slices, &|gi, dsts| {
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
pub(crate) fn for_each_kept<T: Copy>(values: &[T], mask: KeptBits<'_>, mut f: impl FnMut(T)) {
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
fn fixed_values<T: datafusion::arrow::datatypes::ArrowNativeType>(b: &RecordBatch, c: usize) -> datafusion::arrow::buffer::ScalarBuffer<T> {
    let data = b.column(c).to_data();
    datafusion::arrow::buffer::ScalarBuffer::<T>::new(data.buffers()[0].clone(), data.offset(), data.len())
}

/// Write the kept values of column `c` (fixed width `T`, aligned, no NULLs) of every batch, in order, into `dst`.
fn write_kept<T: datafusion::arrow::datatypes::ArrowNativeType>(batches: &[(&RecordBatch, KeptBits<'_>)], c: usize, dst: &mut [u8]) {
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

#[derive(Debug)]
pub(crate) enum Output {
    Batches(Vec<RecordBatch>),
    Rows(usize),
}

