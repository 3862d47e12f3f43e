//! The CPU backend's set operations with the kept (probe) side streamed, as
//! DataFusion's `HashJoinExec` streams its probe side past a collected build
//! side: the build side is collected once, its keys packed over its own
//! bounds ([`PackedDomain::of_side`]) into one table of counts shared by
//! every partition ([`SharedCounts`]); then each output partition reads its
//! probe partition batch by batch, packs the batch's keys over the same
//! bounds (a value outside them matches nothing), spends the counts
//! atomically and outputs the kept rows.
//!
//! The collected path reads both sides whole before it selects a row, so the
//! probe side's packing and selection come after its scan (on TPC-H SF10,
//! `intersect_all_part_supp` spent ~200 ms of a 537 ms query there, where
//! DataFusion's plan probes while it scans). Streaming also never holds the
//! probe side in memory.
//!
//! Exact where equal keys are equal rows ([`ProbeTable::offered`]): which
//! copies of a key are kept depends on the partitions' order, but a set
//! operation outputs its keys, so the answer is SQL's multiset either way.

use std::collections::VecDeque;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, BooleanArray, RecordBatch, RecordBatchOptions};
use datafusion::arrow::buffer::BooleanBuffer;
use datafusion::arrow::compute::BatchCoalescer;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::physical_expr::PhysicalExprRef;
use datafusion::physical_plan::metrics::Time;
use datafusion::physical_plan::SendableRecordBatchStream;
use futures::StreamExt;

use crate::algo::select::{SetOp, SharedCounts};
use crate::keys::PackedDomain;

use super::common::NullMode;
use super::output_filter::OutputColumns;
use super::selection::coerce_like;

/// The build side's counts and what each probe batch needs to spend them.
pub(crate) struct ProbeTable {
    counts: SharedCounts,
    domain: PackedDomain,
    probe_keys: Vec<PhysicalExprRef>,
    types: Vec<DataType>,
    output: OutputColumns,
    schema: SchemaRef,
    /// The table's bytes, reserved until the last partition's stream ends.
    _reservation: Arc<MemoryReservation>,
}

impl ProbeTable {
    /// Can a selection stream its probe side? The rules whose counts are
    /// spent without remembering probe keys (not EXCEPT DISTINCT), NULLs
    /// equal (set operations: the output is the keys), and keys of one
    /// integer-like type on both sides, which pack exactly.
    pub(crate) fn offered(op: SetOp, nulls: NullMode, probe_types: &[DataType], build_types: &[DataType]) -> bool {
        matches!(op, SetOp::IntersectAll | SetOp::ExceptAll | SetOp::IntersectDistinct)
            && nulls == NullMode::Equal
            && probe_types == build_types
            && PackedDomain::packs(probe_types)
    }

    /// The table of the build side's key columns (`build_cols[b][c]`, of
    /// `types`), its bytes added to `reservation`; None when the build side's
    /// keys do not pack into 64 bits.
    pub(crate) fn build(
        op: SetOp,
        build_cols: &[Vec<ArrayRef>],
        types: Vec<DataType>,
        probe_keys: Vec<PhysicalExprRef>,
        output: OutputColumns,
        schema: SchemaRef,
        reservation: Arc<MemoryReservation>,
    ) -> Result<Option<Self>> {
        let Some(domain) = PackedDomain::of_side(build_cols, &types)? else { return Ok(None) };
        let packed = crate::host::par_map(build_cols, 1, |cols| domain.pack(cols))?;
        crate::util::trace("streamed probe: build keys packed");
        let chunks: Vec<&[u64]> = packed.iter().map(|c| c.as_slice()).collect();
        // The domain has fewer keys than 2^64 - 1 (PackedDomain::of_side).
        let Some(counts) = SharedCounts::new(op, &chunks, domain.size() as u64) else { return Ok(None) };
        crate::host::drop_later(packed);
        reservation.try_grow(counts.bytes())?;
        Ok(Some(ProbeTable { counts, domain, probe_keys, types, output, schema, _reservation: reservation }))
    }

    /// What EXPLAIN ANALYZE shows of the table.
    pub(crate) fn describe(&self) -> String {
        let kind = if self.counts.is_dense() { "an array" } else { "hash tables" };
        format!("cpu (kept side streamed past the other side's counts in {kind}, {} MB)", self.counts.bytes() >> 20)
    }

    /// Which rows of one probe batch are kept (their counts spent).
    fn keep(&self, batch: &RecordBatch) -> Result<BooleanBuffer> {
        let n = batch.num_rows();
        let cols =
            self.probe_keys.iter().map(|k| k.evaluate(batch)?.into_array(n)).collect::<Result<Vec<ArrayRef>>>()?;
        let keys = self.domain.pack(&coerce_like(cols, &self.types)?)?;
        Ok(self.counts.keep_batch(&keys))
    }

    /// One probe batch's kept rows into `out` (whole output batches) or, for
    /// an output without columns, their number as one batch into `ready`.
    fn push(
        &self,
        batch: RecordBatch,
        out: &mut Option<BatchCoalescer>,
        ready: &mut VecDeque<RecordBatch>,
        batch_size: usize,
    ) -> Result<()> {
        let kept = self.keep(&batch)?;
        let columns: Vec<ArrayRef> = match &self.output {
            OutputColumns::RowCount => {
                let rows = kept.count_set_bits();
                if rows > 0 {
                    let options = RecordBatchOptions::new().with_row_count(Some(rows));
                    ready.push_back(RecordBatch::try_new_with_options(self.schema.clone(), vec![], &options)?);
                }
                return Ok(());
            }
            OutputColumns::All => batch.columns().to_vec(),
            OutputColumns::Columns(c) => c.iter().map(|&i| batch.column(i).clone()).collect(),
        };
        let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
        let projected = RecordBatch::try_new_with_options(self.schema.clone(), columns, &options)?;
        let out = out.get_or_insert_with(|| BatchCoalescer::new(self.schema.clone(), batch_size));
        out.push_batch_with_filter(projected, &BooleanArray::new(kept, None))?;
        while let Some(b) = out.next_completed_batch() {
            ready.push_back(b);
        }
        Ok(())
    }

    /// One output partition: `input` (its probe partition) filtered batch by
    /// batch, in batches of about `batch_size` rows, the work timed in `elapsed_compute`.
    pub(crate) fn stream(
        self: Arc<Self>,
        input: SendableRecordBatchStream,
        batch_size: usize,
        elapsed_compute: Time,
    ) -> futures::stream::BoxStream<'static, Result<RecordBatch>> {
        struct State {
            table: Arc<ProbeTable>,
            input: SendableRecordBatchStream,
            out: Option<BatchCoalescer>,
            ready: VecDeque<RecordBatch>,
            done: bool,
        }
        let state = State { table: self, input, out: None, ready: VecDeque::new(), done: false };
        futures::stream::unfold(state, move |mut st| {
            let elapsed_compute = elapsed_compute.clone();
            async move {
                loop {
                    if let Some(b) = st.ready.pop_front() {
                        return Some((Ok(b), st));
                    }
                    if st.done {
                        return None;
                    }
                    let failed = match st.input.next().await {
                        Some(Ok(batch)) => {
                            let _timer = elapsed_compute.timer();
                            st.table.push(batch, &mut st.out, &mut st.ready, batch_size).err()
                        }
                        Some(Err(e)) => Some(e),
                        None => {
                            st.done = true;
                            crate::util::trace("probe partition streamed");
                            let finished = st.out.as_mut().map(|out| {
                                out.finish_buffered_batch()?;
                                while let Some(b) = out.next_completed_batch() {
                                    st.ready.push_back(b);
                                }
                                Ok::<_, DataFusionError>(())
                            });
                            finished.and_then(|r| r.err())
                        }
                    };
                    if let Some(e) = failed {
                        st.done = true;
                        st.ready.clear();
                        return Some((Err(e), st));
                    }
                }
            }
        })
        .boxed()
    }
}
