//! Persistent host threads for the transfer paths' parallel loops.
//!
//! Packing keys into pinned staging runs one parallel loop per 8M-key fill,
//! two dozen fills per 100M-row query. Spawning and joining 16 scoped threads
//! for each fill was measured at ~0.5 ms on the GPU machine (`setfusion
//! doctor` prints it), ~12 ms of a 75 ms query; these threads are started once
//! and reused.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// One call of [`for_each_index`]: tasks `0..n` of `f`, claimed by index.
struct Job {
    /// The caller's closure with its lifetime erased; see the safety argument
    /// in [`for_each_index`]. Called only for claimed indices `< n`.
    f: &'static (dyn Fn(usize) + Sync),
    n: usize,
    next: AtomicUsize,
    /// Tasks finished (run or panicked), and the first panic's payload.
    state: Mutex<(usize, Option<Box<dyn std::any::Any + Send>>)>,
    all_done: Condvar,
}

impl Job {
    /// Claim and run tasks until none is left.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            let result = catch_unwind(AssertUnwindSafe(|| (self.f)(i)));
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            st.0 += 1;
            if let Err(p) = result {
                st.1.get_or_insert(p);
            }
            if st.0 == self.n {
                self.all_done.notify_all();
            }
        }
    }
}

struct Pool {
    jobs: Mutex<Sender<Arc<Job>>>,
    workers: usize,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let (tx, rx) = channel::<Arc<Job>>();
        let rx = Arc::new(Mutex::new(rx));
        // The caller works too, so one thread fewer than the copy threads.
        let workers = super::copy_threads().saturating_sub(1);
        for i in 0..workers {
            let rx: Arc<Mutex<Receiver<Arc<Job>>>> = rx.clone();
            let spawned = std::thread::Builder::new().name(format!("setfusion-copy-{i}")).spawn(move || loop {
                let job = match rx.lock().unwrap_or_else(|e| e.into_inner()).recv() {
                    Ok(job) => job,
                    Err(_) => return, // the pool is gone
                };
                job.work();
            });
            if spawned.is_err() {
                // Fewer threads only means less parallelism: the caller runs every task it is left.
                return Pool { jobs: Mutex::new(tx), workers: i };
            }
        }
        Pool { jobs: Mutex::new(tx), workers }
    })
}

/// Run `f(0)`, ..., `f(n - 1)` on the pool's threads and the calling thread;
/// returns when every call has returned (a panic in one is re-raised here).
pub(crate) fn for_each_index(n: usize, f: &(dyn Fn(usize) + Sync)) {
    if n <= 1 {
        (0..n).for_each(f);
        return;
    }
    // SAFETY: `f` is only called by `Job::work` for an index it claimed below `n`,
    // and this function does not return (or unwind) before all `n` such calls have
    // finished (the counter below reaches `n`), so no call outlives the borrow. A
    // worker that receives the job after every index was claimed never calls `f`;
    // the `Job` itself is reference counted and 'static.
    let f: &'static (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), _>(f) };
    let job = Arc::new(Job { f, n, next: AtomicUsize::new(0), state: Mutex::new((0, None)), all_done: Condvar::new() });
    let p = pool();
    {
        let tx = p.jobs.lock().unwrap_or_else(|e| e.into_inner());
        for _ in 0..p.workers.min(n - 1) {
            // A send only fails if every worker is gone: the caller then runs all tasks.
            let _ = tx.send(job.clone());
        }
    }
    job.work();
    let mut st = job.state.lock().unwrap_or_else(|e| e.into_inner());
    while st.0 < n {
        st = job.all_done.wait(st).unwrap_or_else(|e| e.into_inner());
    }
    if let Some(panic) = st.1.take() {
        drop(st);
        resume_unwind(panic);
    }
}

/// Run `f(i, &mut items[i])` for every item on the pool (each item is handed
/// to exactly one task, so tasks may mutate their own item).
pub(crate) fn for_each_mut<T: Send>(items: &mut [T], f: &(dyn Fn(usize, &mut T) + Sync)) {
    let slots: Vec<Mutex<&mut T>> = items.iter_mut().map(Mutex::new).collect();
    for_each_index(slots.len(), &|i| f(i, &mut slots[i].lock().unwrap_or_else(|e| e.into_inner())));
}

/// `f` over `items`, in order, on the pool when there are many (at least
/// 1024 per thread): the per-batch bookkeeping of key columns (one Arrow
/// array per 8192-row batch) costs milliseconds on one thread over a
/// 100M-row input.
pub(crate) fn par_map<T: Sync, R: Send, E: Send>(items: &[T], f: impl Fn(&T) -> Result<R, E> + Sync) -> Result<Vec<R>, E> {
    const PER_THREAD: usize = 1024;
    let threads = super::copy_threads().min(items.len() / PER_THREAD).max(1);
    if threads == 1 {
        return items.iter().map(f).collect();
    }
    let chunks: Vec<&[T]> = items.chunks(items.len().div_ceil(threads)).collect();
    let mut results: Vec<Option<Result<Vec<R>, E>>> = chunks.iter().map(|_| None).collect();
    for_each_mut(&mut results, &|i, slot| *slot = Some(chunks[i].iter().map(&f).collect()));
    let mut out = Vec::with_capacity(items.len());
    for r in results {
        out.extend(r.expect("for_each_mut runs every task")?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_every_index_once_and_reraises_panics() {
        for n in [0usize, 1, 2, 17, 1000] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for_each_index(n, &|i| {
                hits[i].fetch_add(1, Ordering::Relaxed);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 1), "n = {n}");
        }
        let r = catch_unwind(|| for_each_index(8, &|i| assert!(i != 5, "task 5 fails")));
        assert!(r.is_err());
        // The pool still works after a panic.
        let sum = AtomicUsize::new(0);
        for_each_index(100, &|i| {
            sum.fetch_add(i, Ordering::Relaxed);
        });
        assert_eq!(sum.load(Ordering::Relaxed), 4950);
    }
}
