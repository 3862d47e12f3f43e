//! Memory accounting with DataFusion's `MemoryPool`, shared by the operators.
//!
//! Each execution of a setfusion operator registers one `MemoryConsumer`
//! named after the operator ([`reservation`]) and grows it (`try_grow`) for
//! what it holds: collected input batches ([`collect_reserved`]), encoded keys
//! and selections, and output batches it has built but not yet returned. It
//! shrinks as those are released and is freed when the operator's streams are
//! consumed or dropped. When the pool refuses, the query fails with
//! DataFusion's own `ResourcesExhausted` error ([`unshare`] keeps that kind
//! through a result shared by partitions). Nothing spills to disk.
//!
//! While an operator holds the device ([`hold_device`]) its reservation also
//! counts the device's pinned staging buffers, the host memory its uploads
//! pass through; a pool that cannot hold them sends the work to the CPU
//! backend (which needs none) with the pool's reason.
//!
//! [`SharedRun`] is the one execution that an operator's partitions share (the
//! first partition polled runs it): a partition executed again starts a new
//! execution, so a finished execution's memory is not kept for a later one.

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};

use datafusion::arrow::array::{Array, RecordBatch};
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::TaskContext;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use futures::StreamExt;
use tokio::sync::OnceCell;

use crate::config::SetfusionConfig;
use crate::gpu::{Gpu, Lease, STAGING_HOST_BYTES};

/// One operator's hold on the device: the [`Lease`] (device lock and budget)
/// and, for as long as it is held, the pinned staging's bytes in the
/// operator's memory reservation. Derefs to the [`Gpu`].
pub(crate) struct DeviceHold<'a> {
    lease: Lease<'a>,
    /// Dropped with the hold: the staging's bytes go back to the pool.
    _staging: Option<MemoryReservation>,
}

impl std::ops::Deref for DeviceHold<'_> {
    type Target = Gpu;
    fn deref(&self) -> &Gpu {
        &self.lease
    }
}

/// Take `device` for one operator's run under `cfg`'s device budget, first
/// counting [`STAGING_HOST_BYTES`] in `memory` (the operator's reservation;
/// None where the caller has no pool, as the benchmarks). The pool's refusal
/// is DataFusion's `ResourcesExhausted`, which callers treat like any other
/// device trouble: the CPU backend answers instead.
pub(crate) fn hold_device<'a>(
    device: &'a Gpu,
    cfg: &SetfusionConfig,
    memory: Option<&MemoryReservation>,
) -> Result<DeviceHold<'a>> {
    let staging = match memory {
        Some(m) => {
            let r = m.new_empty();
            r.try_grow(STAGING_HOST_BYTES)?;
            Some(r)
        }
        None => None,
    };
    Ok(DeviceHold { lease: device.lease(cfg.memory_limit.0), _staging: staging })
}

/// A reservation of a new consumer called `name` in the session's memory pool.
pub(crate) fn reservation(context: &TaskContext, name: &str) -> Arc<MemoryReservation> {
    Arc::new(MemoryConsumer::new(name).register(context.memory_pool()))
}

/// The bytes DataFusion counts for `batch` (its arrays' buffers).
pub(crate) fn batch_bytes(batch: &RecordBatch) -> usize {
    batch.get_array_memory_size()
}

/// The bytes of `batch`'s slices of its buffers: for output batches that are
/// slices of one larger buffer (a pinned output region, the device's kept
/// keys), where [`batch_bytes`] would count the whole buffer once per slice.
pub(crate) fn slice_bytes(batch: &RecordBatch) -> usize {
    batch.columns().iter().map(|c| array_slice_bytes(c.as_ref())).sum()
}

/// The bytes of one array's slice of its buffers (see [`slice_bytes`]).
pub(crate) fn array_slice_bytes(array: &dyn Array) -> usize {
    array.to_data().get_slice_memory_size().unwrap_or_else(|_| array.get_array_memory_size())
}

/// Collect every partition of `plan`, each on its own task (as
/// `collect_partitioned` does), growing `reservation` by each batch's size as
/// it arrives. The first error (the pool's `ResourcesExhausted` among them)
/// stops the other partitions.
pub(crate) async fn collect_reserved(
    plan: Arc<dyn ExecutionPlan>,
    context: Arc<TaskContext>,
    reservation: &Arc<MemoryReservation>,
) -> Result<Vec<Vec<RecordBatch>>> {
    let n = plan.output_partitioning().partition_count();
    collect_partitions_reserved(plan, 0..n, context, reservation).await
}

/// [`collect_reserved`] for some of `plan`'s partitions only: element `i` of
/// the result holds the batches of the `i`-th partition of `partitions`.
pub(crate) async fn collect_partitions_reserved(
    plan: Arc<dyn ExecutionPlan>,
    partitions: std::ops::Range<usize>,
    context: Arc<TaskContext>,
    reservation: &Arc<MemoryReservation>,
) -> Result<Vec<Vec<RecordBatch>>> {
    let first = partitions.start;
    let n = partitions.len();
    // A JoinSet aborts the other partitions' tasks when it is dropped (on the first error).
    let mut tasks = tokio::task::JoinSet::new();
    for p in partitions {
        let mut stream = plan.execute(p, context.clone())?;
        let r = reservation.clone();
        tasks.spawn(async move {
            let mut out = Vec::new();
            while let Some(b) = stream.next().await {
                let b = b?;
                r.try_grow(batch_bytes(&b))?;
                out.push(b);
            }
            Ok::<_, DataFusionError>((p - first, out))
        });
    }
    let mut parts: Vec<Vec<RecordBatch>> = (0..n).map(|_| Vec::new()).collect();
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(r) => {
                let (p, out) = r?;
                parts[p] = out;
            }
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => return Err(DataFusionError::Execution(format!("setfusion: input task ended: {e}"))),
        }
    }
    Ok(parts)
}

/// A shared error as its user should see it: the pool's `ResourcesExhausted`
/// keeps its kind (and message); other errors stay shared.
pub(crate) fn unshare(e: &Arc<DataFusionError>) -> DataFusionError {
    match e.as_ref().find_root() {
        DataFusionError::ResourcesExhausted(m) => DataFusionError::ResourcesExhausted(m.clone()),
        _ => DataFusionError::Shared(e.clone()),
    }
}

/// The execution an operator's partitions share. See the module documentation.
pub(crate) struct SharedRun<T> {
    current: Mutex<Arc<Execution<T>>>,
}

/// One execution: its result, computed once, and the partitions that joined it.
pub(crate) struct Execution<T> {
    cell: OnceCell<std::result::Result<Arc<T>, Arc<DataFusionError>>>,
    joined: Mutex<HashSet<usize>>,
}

impl<T> SharedRun<T> {
    pub(crate) fn new() -> Self {
        Self { current: Mutex::new(Arc::new(Execution { cell: OnceCell::new(), joined: Mutex::new(HashSet::new()) })) }
    }

    /// The execution partition `partition` takes part in: the current one, or
    /// a new one when that partition already took part in it (the plan runs again).
    pub(crate) fn join(&self, partition: usize) -> Arc<Execution<T>> {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = !current.joined.lock().unwrap_or_else(|e| e.into_inner()).insert(partition);
        if fresh {
            let joined = Mutex::new(HashSet::from([partition]));
            *current = Arc::new(Execution { cell: OnceCell::new(), joined });
        }
        current.clone()
    }
}

impl<T> Default for SharedRun<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for SharedRun<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedRun")
    }
}

impl<T> Execution<T> {
    /// The execution's result: `run`'s, run by the first caller.
    pub(crate) async fn get<F: Future<Output = Result<T>>>(&self, run: impl FnOnce() -> F) -> Result<Arc<T>> {
        self.cell
            .get_or_init(|| async move { run().await.map(Arc::new).map_err(Arc::new) })
            .await
            .clone()
            .map_err(|e| unshare(&e))
    }
}

/// One partition's part of a shared result, taken by the partition's stream
/// (so that it is released as the stream goes, not kept with the result).
pub(crate) struct Parts<P> {
    parts: Vec<Mutex<Option<P>>>,
}

impl<P> Parts<P> {
    pub(crate) fn new(parts: Vec<P>) -> Self {
        Self { parts: parts.into_iter().map(|p| Mutex::new(Some(p))).collect() }
    }

    /// Partition `p`'s part (None: no such partition, or already taken).
    pub(crate) fn take(&self, p: usize) -> Option<P> {
        self.parts.get(p).and_then(|m| m.lock().unwrap_or_else(|e| e.into_inner()).take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryPool};

    #[test]
    fn resources_exhausted_survives_sharing() {
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(10));
        let r = MemoryConsumer::new("t").register(&pool);
        let e = r.try_grow(100).unwrap_err();
        assert!(matches!(e, DataFusionError::ResourcesExhausted(_)), "{e}");
        let shared = Arc::new(e);
        assert!(matches!(unshare(&shared), DataFusionError::ResourcesExhausted(_)));
        let other = Arc::new(DataFusionError::Execution("x".into()));
        assert!(matches!(unshare(&other), DataFusionError::Shared(_)));
    }

    #[test]
    fn a_partition_executed_again_starts_a_new_execution() {
        let run: SharedRun<()> = SharedRun::new();
        let (a, b) = (run.join(0), run.join(1));
        assert!(Arc::ptr_eq(&a, &b));
        let c = run.join(0);
        assert!(!Arc::ptr_eq(&a, &c));
        assert!(Arc::ptr_eq(&c, &run.join(1)));
    }
}
