//! Host threads: the one place they start (issue 29). Three kinds:
//!
//! - the pool's persistent threads for parallel loops ([`for_each_mut`],
//!   [`par_map`], [`parallel_gather`]), sized by [`copy_threads`];
//! - the one background thread for work off the query's path ([`later`],
//!   [`drop_later`]);
//! - named threads for work that blocks or runs long beside the caller (file
//!   reads, one thread per device, the device's start): [`scope`] with
//!   [`Scoped::spawn`], and [`spawn`].
//!
//! Packing keys into pinned staging runs one parallel loop per 8M-key fill,
//! two dozen fills per 100M-row query. Spawning and joining 16 scoped threads
//! for each fill was measured at ~0.5 ms on the GPU machine (`setfusion
//! doctor` prints it), ~12 ms of a 75 ms query; these threads are started once
//! and reused.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
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
    /// One channel per worker: a job is sent to every worker at once. (One
    /// receiver shared behind a mutex hands a job to the waiting workers one
    /// after another, each woken by the last: ~0.7 ms before 15 workers run,
    /// measured on the GPU machine.)
    workers: Mutex<Vec<Sender<Arc<Job>>>>,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(|| {
        let mut senders = Vec::new();
        // The caller works too, so one thread fewer than the cores (at most
        // 32): each loop takes at most the copy threads (16), and two devices
        // packing at once (`setfusion.devices`) take different workers.
        let cores = std::thread::available_parallelism().map_or(4, |n| n.get()).min(32);
        for i in 0..cores.max(copy_threads()).saturating_sub(1) {
            let (tx, rx) = channel::<Arc<Job>>();
            let spawned = std::thread::Builder::new().name(format!("setfusion-copy-{i}")).spawn(move || {
                // Ends when the pool is gone.
                for job in rx {
                    job.work();
                }
            });
            if spawned.is_err() {
                // Fewer threads only means less parallelism: the caller runs every task it is left.
                break;
            }
            senders.push(tx);
        }
        Pool { workers: Mutex::new(senders) }
    })
}

/// Host threads for copies, packing and scans over key columns: one per core,
/// at most 16 (beyond that the copies are bound by memory bandwidth).
pub fn copy_threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get()).min(16)
}

/// Threads that run beside the caller and end before it returns
/// ([`std::thread::scope`]), each started by [`Scoped::spawn`] with a name
/// (`setfusion-<what>`, as debuggers and profilers show it).
pub fn scope<'env, T>(f: impl for<'scope> FnOnce(&Scoped<'scope, 'env>) -> T) -> T {
    std::thread::scope(|s| f(&Scoped(s)))
}

/// A [`scope`]'s handle for starting its threads.
pub struct Scoped<'scope, 'env>(&'scope std::thread::Scope<'scope, 'env>);

impl<'scope, 'env> Scoped<'scope, 'env> {
    /// Run `f` on a thread named `setfusion-<what>`. A thread that cannot
    /// start panics, as [`std::thread::Scope::spawn`] does.
    pub fn spawn<T: Send + 'scope>(
        &self,
        what: &str,
        f: impl FnOnce() -> T + Send + 'scope,
    ) -> std::thread::ScopedJoinHandle<'scope, T> {
        std::thread::Builder::new()
            .name(format!("setfusion-{what}"))
            .spawn_scoped(self.0, f)
            .unwrap_or_else(|e| panic!("setfusion: cannot start a host thread ({what}): {e}"))
    }
}

/// Run `f` on a new thread named `setfusion-<what>`, detached from the
/// caller (who may join it); `Err` when the thread cannot start.
pub fn spawn<T: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<T>> {
    std::thread::Builder::new().name(format!("setfusion-{what}")).spawn(f)
}

/// Start the pool's threads now (the device's background start does, so no
/// query waits for them).
pub(crate) fn warm_up() {
    pool();
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
    {
        // Loops take the workers in turn from where the last one stopped, so
        // loops running at once (one per device) land on different workers.
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let workers = pool().workers.lock().unwrap_or_else(|e| e.into_inner());
        let take = (n - 1).min(workers.len());
        let first = NEXT.fetch_add(take, Ordering::Relaxed);
        for j in 0..take {
            // A send only fails if that worker is gone: the others and the caller run its share.
            let _ = workers[(first + j) % workers.len()].send(job.clone());
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
pub fn for_each_mut<T: Send>(items: &mut [T], f: &(dyn Fn(usize, &mut T) + Sync)) {
    let slots: Vec<Mutex<&mut T>> = items.iter_mut().map(Mutex::new).collect();
    for_each_index(slots.len(), &|i| f(i, &mut slots[i].lock().unwrap_or_else(|e| e.into_inner())));
}

/// `f` over `items`, in order, on the pool when there are many (at least
/// `per_thread` per thread; fewer: on the calling thread). The per-batch
/// bookkeeping of key columns (one Arrow array per batch) costs milliseconds
/// on one thread over a 100M-row input.
pub(crate) fn par_map<T: Sync, R: Send, E: Send>(
    items: &[T],
    per_thread: usize,
    f: impl Fn(&T) -> Result<R, E> + Sync,
) -> Result<Vec<R>, E> {
    let threads = copy_threads().min(items.len() / per_thread.max(1)).max(1);
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

/// `buf` cut into consecutive parts of the given lengths (their sum at most
/// `buf.len()`), for tasks that each fill their own part.
pub(crate) fn split_mut<T>(mut buf: &mut [T], lens: impl IntoIterator<Item = usize>) -> Vec<&mut [T]> {
    lens.into_iter()
        .map(|n| {
            let (part, rest) = std::mem::take(&mut buf).split_at_mut(n);
            buf = rest;
            part
        })
        .collect()
}

/// Copy `pieces` back to back into `dst`, splitting the work over `threads`.
pub(crate) fn parallel_gather<T: Copy + Send + Sync>(
    pieces: &[&[T]],
    dst: &mut [T],
    threads: usize,
    observe: &(dyn Fn(&[T]) + Sync),
) {
    let total = dst.len();
    // At least 2 MiB per thread: small uploads (a similarity join's 11 MB
    // collection) pay more for spawning 16 threads than they save, and compete
    // with the host work they overlap.
    let threads = threads.min((total * std::mem::size_of::<T>()) >> 21);
    if threads <= 1 || total < (1 << 20) {
        let mut at = 0;
        for p in pieces {
            dst[at..at + p.len()].copy_from_slice(p);
            observe(p);
            at += p.len();
        }
        return;
    }
    let per = total.div_ceil(threads);
    let mut parts = Vec::with_capacity(threads);
    let (mut rest, mut base) = (dst, 0usize);
    while !rest.is_empty() {
        let n = per.min(rest.len());
        let (mine, tail) = rest.split_at_mut(n);
        rest = tail;
        parts.push((base, mine));
        base += n;
    }
    for_each_mut(&mut parts, &|_, (lo, mine)| {
        let (lo, n) = (*lo, mine.len());
        // Copy the part of the concatenation [lo, lo + n) into `mine`.
        let (mut at, mut pos) = (0usize, 0usize);
        for p in pieces {
            let (p_lo, p_hi) = (pos, pos + p.len());
            pos = p_hi;
            let (a, b) = (p_lo.max(lo), p_hi.min(lo + n));
            if a < b {
                let src = &p[a - p_lo..b - p_lo];
                mine[at..at + (b - a)].copy_from_slice(src);
                observe(src);
                at += b - a;
            }
        }
    });
}

/// Drop `x` on a background thread. A 100M-row input is thousands of Arrow
/// batches and key chunks; releasing them (reference counts and small frees
/// into other threads' allocator arenas) was measured at 4-7 ms on the GPU
/// machine, and on the pool no faster: the frees serialise on the arenas.
/// Nothing waits for it, so it leaves the query's critical path.
pub(crate) fn drop_later<T: Send + 'static>(x: T) {
    later(move || drop(x));
}

/// Run `f` on the one background thread for work off the query's path
/// (frees, page-locking kept buffers), in the order given.
pub(crate) fn later<F: FnOnce() + Send + 'static>(f: F) {
    type Task = Box<dyn FnOnce() + Send>;
    static BACKGROUND: OnceLock<Mutex<Sender<Task>>> = OnceLock::new();
    let tx = BACKGROUND.get_or_init(|| {
        let (tx, rx) = channel::<Task>();
        // If the thread cannot start, `rx` is gone, the send below fails and the task is dropped unrun.
        let _ = std::thread::Builder::new().name("setfusion-background".into()).spawn(move || {
            rx.into_iter().for_each(|f| {
                // A task that panics loses its own work only.
                let _ = catch_unwind(AssertUnwindSafe(f));
            })
        });
        Mutex::new(tx)
    });
    let sent = tx.lock().unwrap_or_else(|e| e.into_inner()).send(Box::new(f));
    drop(sent);
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
