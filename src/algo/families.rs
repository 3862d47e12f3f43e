//! Intersection of two families of sets (seed 000, Fort, Sellarès and
//! Valladares, "Intersecting two families of sets on the GPU").
//!
//! A family is a list of sets over one dense element domain (`u32` ids),
//! each set sorted and without repeats ([`Family`]). The result comes at the
//! paper's three levels:
//! * I_c, every pair's intersection, empty ones included (the caller adds the
//!   empty ones: [`PairIntersections`] holds the non-empty ones in pair order);
//! * I_r, the non-empty intersections with their pair ([`PairIntersections`]);
//! * I, the distinct non-empty intersections with their frequency, the number
//!   of pairs giving each ([`DistinctSets`], ordered by size, then
//!   lexicographically, as the paper's duplicate removal orders them).
//!
//! Both backends follow the paper's structure:
//! 1. domain reduction: elements absent from the other family cannot be in an
//!    intersection (done by the caller when it maps elements to ids, see
//!    `Domain` in `exec::families`);
//! 2. the right family's inverted lists, element -> sets containing it (the
//!    paper's "apparitions vectors");
//! 3. count, then fill: for each left set, walking its elements in order and,
//!    for each, the sets of the right family holding it, counts every pair's
//!    intersection size; then the same walk writes the elements. Walking in
//!    element order leaves every intersection sorted;
//! 4. removal of empty intersections;
//! 5. duplicate removal with frequencies.
//!
//! [`pairs_cpu`] / [`distinct_cpu`] run on all host cores (the paper found a
//! CPU port of its own strategy competitive with the C++ library's set
//! intersections); [`pairs_gpu`] / [`distinct_gpu`] run kernels/families.cu.
//! On the device, duplicate removal groups intersections by a 64-bit hash of
//! their elements and verifies every member against its group's first member
//! exactly (a mismatch, a hash collision, sends the slice to the CPU twin), in
//! place of the paper's size-then-lexicographic radix sort; the host sorts the
//! (far fewer) distinct sets at the end.
//!
//! Pairs are processed in slices of left sets whose pair matrix fits the
//! device budget (section 4.6 of the paper slices the second family; slicing
//! the first is the same with the roles swapped, and keeps the right family's
//! inverted lists on the device once), with a final duplicate removal across
//! slices on the host.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use datafusion::arrow::buffer::Buffer;
use datafusion::error::{DataFusionError, Result};

use crate::gpu::{cuda_err, DeviceBuffer, Gpu, TransferStats};

/// Sets over a dense domain of element ids, in CSR form: set `i` is
/// `elements[offsets[i]..offsets[i + 1]]`, ascending, without repeats.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Family {
    pub offsets: Vec<usize>,
    pub elements: Vec<u32>,
}

impl Family {
    /// A family from sets given as any lists of ids (sorted and deduplicated here).
    pub fn from_sets<S: AsRef<[u32]>>(sets: &[S]) -> Family {
        let mut f = Family { offsets: Vec::with_capacity(sets.len() + 1), elements: Vec::new() };
        f.offsets.push(0);
        for s in sets {
            let start = f.elements.len();
            f.elements.extend_from_slice(s.as_ref());
            let kept = super::ssjoin_prep::sort_dedup(&mut f.elements[start..]);
            f.elements.truncate(start + kept);
            f.offsets.push(f.elements.len());
        }
        f
    }

    /// The number of sets.
    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Set `i`.
    pub fn set(&self, i: usize) -> &[u32] {
        &self.elements[self.offsets[i]..self.offsets[i + 1]]
    }

    /// The largest element id plus one (0 for a family without elements):
    /// the largest of the sets' last elements, as each set is ascending (a
    /// look at every set, not every element: a scan of 10^9 elements took
    /// ~0.65 s of MISI's choice of method).
    pub fn domain(&self) -> usize {
        self.offsets.windows(2).filter(|w| w[1] > w[0]).map(|w| self.elements[w[1] - 1] as usize + 1).max().unwrap_or(0)
    }
}

/// The pairs to intersect: every (left set, right set), or in the self form
/// (one family with itself) the pairs (i, j) with `j >= right_from[i]`. The
/// caller orders the family so that this is its pairs with left id < right id.
#[derive(Debug, Clone, Copy)]
pub struct PairSpace<'a> {
    pub left: &'a Family,
    pub right: &'a Family,
    /// Self form: the first right set each left set pairs with.
    pub right_from: Option<&'a [u32]>,
}

impl PairSpace<'_> {
    /// The element domain both families' ids lie in ([`Family::domain`] of
    /// each; the self form's one family once).
    pub fn domain(&self) -> usize {
        if std::ptr::eq(self.left, self.right) {
            return self.left.domain();
        }
        self.left.domain().max(self.right.domain())
    }

    /// The first right set that left set `i` pairs with.
    pub fn first_right(&self, i: usize) -> usize {
        self.right_from.map_or(0, |f| f[i] as usize)
    }

    /// The number of pairs (I_c's size) of the left sets in `rows`.
    pub fn pair_count(&self, rows: Range<usize>) -> u64 {
        let k = self.right.len() as u64;
        rows.map(|i| k - (self.first_right(i) as u64).min(k)).sum()
    }
}

/// Non-empty intersections with their pairs (I_r), in (left, right) order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PairIntersections {
    pub left: Vec<u32>,
    pub right: Vec<u32>,
    /// `offsets.len() == left.len() + 1`.
    pub offsets: Vec<usize>,
    pub elements: Vec<u32>,
}

impl PairIntersections {
    fn new() -> Self {
        PairIntersections { offsets: vec![0], ..Default::default() }
    }

    pub fn len(&self) -> usize {
        self.left.len()
    }

    pub fn is_empty(&self) -> bool {
        self.left.is_empty()
    }

    /// Intersection `p`'s elements.
    pub fn set(&self, p: usize) -> &[u32] {
        &self.elements[self.offsets[p]..self.offsets[p + 1]]
    }

    /// Append `other` (whose pairs come after this one's).
    pub fn append(&mut self, other: &PairIntersections) {
        let base = self.elements.len();
        self.left.extend_from_slice(&other.left);
        self.right.extend_from_slice(&other.right);
        self.offsets.extend(other.offsets[1..].iter().map(|o| o + base));
        self.elements.extend_from_slice(&other.elements);
    }
}

/// Distinct non-empty intersections (I) with frequencies, ordered by size,
/// then lexicographically.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DistinctSets {
    pub offsets: Vec<usize>,
    pub elements: Vec<u32>,
    pub frequency: Vec<u64>,
}

impl DistinctSets {
    pub fn len(&self) -> usize {
        self.frequency.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frequency.is_empty()
    }

    pub fn set(&self, p: usize) -> &[u32] {
        &self.elements[self.offsets[p]..self.offsets[p + 1]]
    }
}

/// I as output columns, in I's order: set `p` is
/// `values()[offsets()[p]..offsets()[p + 1]]` (i32 offsets, `len + 1` of
/// them; u64 values, the caller's image of each element id) with frequency
/// `frequency()[p]`. Arrow buffers, so output arrays take them as they are.
#[derive(Debug, Clone)]
pub struct DistinctColumns {
    pub offsets: Buffer,
    pub values: Buffer,
    pub frequency: Buffer,
    pub len: usize,
}

impl DistinctColumns {
    pub fn from_vecs(offsets: Vec<i32>, values: Vec<u64>, frequency: Vec<u64>) -> Result<Self> {
        let len = frequency.len();
        if offsets.len() != len + 1 || offsets.last().map(|&o| o as usize) != Some(values.len()) {
            return Err(DataFusionError::Internal("families: output columns of different lengths".into()));
        }
        Ok(Self {
            offsets: Buffer::from_vec(offsets),
            values: Buffer::from_vec(values),
            frequency: Buffer::from_vec(frequency),
            len,
        })
    }

    pub fn offsets(&self) -> &[i32] {
        &self.offsets.typed_data::<i32>()[..self.len + 1]
    }

    pub fn values(&self) -> &[u64] {
        let offsets = self.offsets();
        &self.values.typed_data::<u64>()[..offsets[self.len] as usize]
    }

    pub fn frequency(&self) -> &[u64] {
        &self.frequency.typed_data::<u64>()[..self.len]
    }

    pub fn set(&self, p: usize) -> &[u64] {
        let o = self.offsets();
        &self.values()[o[p] as usize..o[p + 1] as usize]
    }
}

/// Most tied neighbours whose positions `fam_out_order` hands back; beyond
/// them the host finds the runs from every set's key.
const TIE_MARKS: usize = 1 << 20;

/// The runs `[start, end)` of sets whose ordering keys tie, from the tied
/// positions (ascending): position `i` ties set `i` to set `i - 1`.
fn tie_runs_of_marks(marks: &[u32]) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &i in marks {
        let i = i as usize;
        match runs.last_mut() {
            Some(run) if run.1 == i => run.1 = i + 1,
            _ => runs.push((i - 1, i + 1)),
        }
    }
    runs
}

/// The same runs from every set's key and size: equal keys of sets longer
/// than a key's `cap` elements.
fn tie_runs_of_keys(keys: &[u64], lens: &[u32], cap: u32) -> Vec<(usize, usize)> {
    let marks: Vec<u32> =
        (1..keys.len()).filter(|&i| lens[i] > cap && keys[i] == keys[i - 1]).map(|i| i as u32).collect();
    tie_runs_of_marks(&marks)
}

/// The sets of each run (see [`tie_runs_of_marks`]) ordered in place by
/// (size, values ^ `flip`), as [`FlatDistinct::into_sorted`] orders ties. The
/// columns as in [`DistinctColumns`]: a run's sets keep their place in the
/// columns as a block, so only the run is rewritten.
fn order_ties(offsets: &mut [i32], values: &mut [u64], frequency: &mut [u64], runs: &[(usize, usize)], flip: u64) {
    for &(start, end) in runs {
        let lo = offsets[start] as usize;
        let region: Vec<u64> = values[lo..offsets[end] as usize].to_vec();
        let bounds: Vec<usize> = offsets[start..=end].iter().map(|&o| o as usize - lo).collect();
        let freqs: Vec<u64> = frequency[start..end].to_vec();
        let set = |i: usize| &region[bounds[i]..bounds[i + 1]];
        let mut run: Vec<usize> = (0..end - start).collect();
        run.sort_unstable_by(|&a, &b| {
            let (x, y) = (set(a), set(b));
            x.len().cmp(&y.len()).then_with(|| x.iter().map(|v| v ^ flip).cmp(y.iter().map(|v| v ^ flip)))
        });
        let mut at = lo;
        for (k, &i) in run.iter().enumerate() {
            values[at..at + set(i).len()].copy_from_slice(set(i));
            at += set(i).len();
            offsets[start + k + 1] = at as i32;
            frequency[start + k] = freqs[i];
        }
    }
}

/// What [`distinct_gpu_columns`] returns: output columns, or the sets by id.
#[derive(Debug, Clone)]
pub enum DistinctOut {
    Columns(DistinctColumns),
    Sets(DistinctSets),
}

impl DistinctOut {
    pub fn len(&self) -> usize {
        match self {
            DistinctOut::Columns(c) => c.len,
            DistinctOut::Sets(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// As [`DistinctSets`], values read as element ids (columns written with
    /// the identity as `id_values` and no flip).
    pub fn into_sets(self) -> DistinctSets {
        match self {
            DistinctOut::Sets(s) => s,
            DistinctOut::Columns(c) => DistinctSets {
                offsets: c.offsets().iter().map(|&o| o as usize).collect(),
                elements: c.values().iter().map(|&v| v as u32).collect(),
                frequency: c.frequency().to_vec(),
            },
        }
    }
}

/// The right family's inverted lists: `sets[offsets[e]..offsets[e + 1]]` are
/// the right sets holding element `e`, ascending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvertedLists {
    pub offsets: Vec<u32>,
    pub sets: Vec<u32>,
}

impl InvertedLists {
    /// Inverted lists of `f` over element ids below `domain` (the paper's
    /// histogram, scan and fill; set order is kept, so lists ascend).
    /// Large families of large sets are indexed on the host's threads
    /// ([`InvertedLists::of_parallel`]).
    pub fn of(f: &Family, domain: usize) -> InvertedLists {
        if f.elements.len() >= 1 << 24 && f.elements.len() >= 64 * f.len() && threads() > 1 {
            return InvertedLists::of_parallel(f, domain);
        }
        InvertedLists::of_serial(f, domain)
    }

    /// [`InvertedLists::of`] on the calling thread.
    fn of_serial(f: &Family, domain: usize) -> InvertedLists {
        let mut offsets = vec![0u32; domain + 1];
        for &e in &f.elements {
            offsets[e as usize + 1] += 1;
        }
        for e in 0..domain {
            offsets[e + 1] += offsets[e];
        }
        let mut cursor: Vec<u32> = offsets[..domain].to_vec();
        let mut sets = vec![0u32; f.elements.len()];
        for j in 0..f.len() {
            for &e in f.set(j) {
                sets[cursor[e as usize] as usize] = j as u32;
                cursor[e as usize] += 1;
            }
        }
        InvertedLists { offsets, sets }
    }

    /// [`InvertedLists::of`] on the host's threads: the element domain is cut
    /// into ranges of about equal element counts (from a sample of the
    /// elements), and each range is counted, then filled, by one task, which
    /// finds its part of every set by a binary search (the sets ascend). One
    /// thread over 10^9 elements took 35-53 s on the H100's host, nearly all
    /// of it cache misses over a universe-sized array.
    fn of_parallel(f: &Family, domain: usize) -> InvertedLists {
        if f.elements.is_empty() {
            return InvertedLists::of_serial(f, domain);
        }
        let mut sample: Vec<u32> = f.elements.iter().step_by(4096).copied().collect();
        sample.sort_unstable();
        let parts = threads() * 4;
        let mut bounds: Vec<usize> = vec![0];
        for p in 1..parts {
            bounds.push((sample[p * sample.len() / parts] as usize).min(domain));
        }
        bounds.push(domain);
        bounds.dedup();
        let ranges: Vec<(usize, usize)> = bounds.windows(2).map(|w| (w[0], w[1])).collect();
        // The part of set j inside [lo, hi).
        let part = |j: usize, lo: usize, hi: usize| -> &[u32] {
            let s = f.set(j);
            let a = s.partition_point(|&e| (e as usize) < lo);
            let b = a + s[a..].partition_point(|&e| (e as usize) < hi);
            &s[a..b]
        };
        // 1. Each range's histogram, written straight into its part of `offsets` (shifted by one).
        let mut offsets = vec![0u32; domain + 1];
        let mut counts: Vec<(usize, &mut [u32])> = Vec::with_capacity(ranges.len());
        let mut rest: &mut [u32] = &mut offsets[1..];
        for &(lo, hi) in &ranges {
            let (mine, tail) = rest.split_at_mut(hi - lo);
            counts.push((lo, mine));
            rest = tail;
        }
        crate::host::for_each_mut(&mut counts, &|_, (lo, c)| {
            let hi = *lo + c.len();
            for j in 0..f.len() {
                for &e in part(j, *lo, hi) {
                    c[e as usize - *lo] += 1;
                }
            }
        });
        drop(counts);
        // 2. The scan (one pass, sequential over the domain).
        for e in 0..domain {
            offsets[e + 1] += offsets[e];
        }
        // 3. Each range fills its part of `sets`, sets in order, so every list ascends.
        let mut sets = vec![0u32; f.elements.len()];
        let mut fills: Vec<(usize, usize, &mut [u32])> = Vec::with_capacity(ranges.len());
        let mut rest: &mut [u32] = &mut sets;
        for &(lo, hi) in &ranges {
            let (mine, tail) = rest.split_at_mut((offsets[hi] - offsets[lo]) as usize);
            fills.push((lo, hi, mine));
            rest = tail;
        }
        let offsets_ref = &offsets;
        crate::host::for_each_mut(&mut fills, &|_, (lo, hi, out)| {
            let base = offsets_ref[*lo];
            let mut cursor: Vec<u32> = offsets_ref[*lo..*hi].iter().map(|&o| o - base).collect();
            for j in 0..f.len() {
                for &e in part(j, *lo, *hi) {
                    let c = &mut cursor[e as usize - *lo];
                    out[*c as usize] = j as u32;
                    *c += 1;
                }
            }
        });
        drop(fills);
        InvertedLists { offsets, sets }
    }

    /// The inverted lists of a pair space's right family (over both families' element ids).
    pub fn of_space(space: &PairSpace) -> InvertedLists {
        InvertedLists::of(space.right, space.domain())
    }

    fn list(&self, e: u32) -> &[u32] {
        let e = e as usize;
        if e + 1 >= self.offsets.len() {
            return &[];
        }
        &self.sets[self.offsets[e] as usize..self.offsets[e + 1] as usize]
    }
}

/// With SETFUSION_TRACE set, print how long a step took (stderr).
fn trace_step(what: &str, since: Instant) {
    if crate::env::trace() {
        eprintln!("families: {what}: {:.1} ms", since.elapsed().as_secs_f64() * 1e3);
    }
}

/// Host threads for the CPU backend.
fn threads() -> usize {
    crate::algo::ssjoin::default_threads()
}

/// Left sets per task of the CPU backend: small enough to balance skewed
/// sets over the threads, large enough that claiming a task costs nothing.
const LEFT_SETS_PER_TASK: usize = 64;

/// Per-thread scratch of the count-then-fill walk: a counter per right set
/// and the list of right sets the current left set touched.
struct Walk {
    count: Vec<u32>,
    touched: Vec<u32>,
}

impl Walk {
    fn new(k_right: usize) -> Walk {
        Walk { count: vec![0; k_right], touched: Vec::new() }
    }

    /// The non-empty intersections of left set `i` with the right sets it
    /// pairs with, in right-set order: calls `emit(j, elements)` for each.
    fn intersections(
        &mut self,
        space: &PairSpace,
        inv: &InvertedLists,
        i: usize,
        buf: &mut Vec<u32>,
        mut emit: impl FnMut(u32, &[u32]),
    ) {
        let from = space.first_right(i) as u32;
        let set = space.left.set(i);
        // Count: the size of every non-empty intersection.
        for &e in set {
            let list = inv.list(e);
            let start = if from == 0 { 0 } else { list.partition_point(|&j| j < from) };
            for &j in &list[start..] {
                let c = &mut self.count[j as usize];
                if *c == 0 {
                    self.touched.push(j);
                }
                *c += 1;
            }
        }
        if self.touched.is_empty() {
            return;
        }
        self.touched.sort_unstable();
        // Scan: the counters become write positions.
        let mut total = 0u32;
        for &j in &self.touched {
            let c = self.count[j as usize];
            self.count[j as usize] = total;
            total += c;
        }
        buf.clear();
        buf.resize(total as usize, 0);
        // Fill, in element order: every intersection comes out sorted.
        for &e in set {
            let list = inv.list(e);
            let start = if from == 0 { 0 } else { list.partition_point(|&j| j < from) };
            for &j in &list[start..] {
                let c = &mut self.count[j as usize];
                buf[*c as usize] = e;
                *c += 1;
            }
        }
        let mut at = 0usize;
        for &j in &self.touched {
            let end = self.count[j as usize] as usize;
            emit(j, &buf[at..end]);
            at = end;
            self.count[j as usize] = 0;
        }
        self.touched.clear();
    }
}

/// I_r for the left sets in `rows`, on all host cores (CPU twin of [`pairs_gpu`]).
pub fn pairs_cpu(space: &PairSpace, rows: Range<usize>) -> PairIntersections {
    pairs_cpu_with(space, &InvertedLists::of_space(space), rows)
}

/// [`pairs_cpu`] with the right family's inverted lists already built.
pub fn pairs_cpu_with(space: &PairSpace, inv: &InvertedLists, rows: Range<usize>) -> PairIntersections {
    let tasks: Vec<Range<usize>> =
        (rows.start..rows.end).step_by(LEFT_SETS_PER_TASK).map(|s| s..(s + LEFT_SETS_PER_TASK).min(rows.end)).collect();
    let parts: Vec<Mutex<Option<PairIntersections>>> = tasks.iter().map(|_| Mutex::new(None)).collect();
    let next = AtomicUsize::new(0);
    let workers = threads().min(tasks.len()).max(1);
    crate::host::scope(|s| {
        for _ in 0..workers {
            s.spawn("families", || {
                let mut walk = Walk::new(space.right.len());
                let mut buf = Vec::new();
                loop {
                    let t = next.fetch_add(1, Ordering::Relaxed);
                    let Some(range) = tasks.get(t) else { break };
                    let mut out = PairIntersections::new();
                    for i in range.clone() {
                        walk.intersections(space, inv, i, &mut buf, |j, elems| {
                            out.left.push(i as u32);
                            out.right.push(j);
                            out.elements.extend_from_slice(elems);
                            out.offsets.push(out.elements.len());
                        });
                    }
                    *parts[t].lock().unwrap() = Some(out);
                }
            });
        }
    });
    let mut all = PairIntersections::new();
    for p in parts {
        if let Some(p) = p.into_inner().unwrap() {
            all.append(&p);
        }
    }
    all
}

/// A 64-bit hash of a set's elements (order-sensitive; sets are sorted).
/// The same function as `fam_set_hash` in kernels/families.cu: the device
/// groups by it and the host merges the device's groups by it.
pub fn set_hash(elems: &[u32]) -> u64 {
    let mut h = 0x9e3779b97f4a7c15u64 ^ (elems.len() as u64).wrapping_mul(0xff51afd7ed558ccd);
    for &e in elems {
        h = mix64(h ^ e as u64);
    }
    mix64(h)
}

/// splitmix64's finaliser (`sf_mix64` in kernels/common.cuh).
fn mix64(mut x: u64) -> u64 {
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58476d1ce4e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d049bb133111eb);
    x ^ (x >> 31)
}

/// Exact duplicate removal with frequencies, sharded by hash so that shards
/// merge on separate threads. A bucket holds every distinct set of one hash
/// (almost always one).
struct Shards {
    shards: Vec<HashMap<u64, Vec<(Box<[u32]>, u64)>>>,
}

/// Shards of the duplicate removal: a power of two.
const SHARDS: usize = 64;

impl Shards {
    fn new() -> Shards {
        Shards { shards: (0..SHARDS).map(|_| HashMap::new()).collect() }
    }

    fn add(&mut self, elems: &[u32], weight: u64) {
        self.add_hashed(set_hash(elems), elems, weight)
    }

    fn add_hashed(&mut self, h: u64, elems: &[u32], weight: u64) {
        let bucket = self.shards[(h >> 58) as usize & (SHARDS - 1)].entry(h).or_default();
        match bucket.iter_mut().find(|(s, _)| &s[..] == elems) {
            Some((_, w)) => *w += weight,
            None => bucket.push((elems.into(), weight)),
        }
    }

    /// Merge the shards of several workers (shard by shard, in parallel) and
    /// order the distinct sets by (size, elements).
    fn merge(parts: Vec<Shards>) -> DistinctSets {
        let mut by_shard: Vec<Vec<HashMap<u64, Vec<(Box<[u32]>, u64)>>>> = (0..SHARDS).map(|_| Vec::new()).collect();
        for p in parts {
            for (s, m) in p.shards.into_iter().enumerate() {
                by_shard[s].push(m);
            }
        }
        let next = AtomicUsize::new(0);
        let sorted: Vec<Mutex<Vec<(Box<[u32]>, u64)>>> = (0..SHARDS).map(|_| Mutex::new(Vec::new())).collect();
        let inputs: Vec<Mutex<Vec<HashMap<u64, Vec<(Box<[u32]>, u64)>>>>> =
            by_shard.into_iter().map(Mutex::new).collect();
        crate::host::scope(|s| {
            for _ in 0..threads().min(SHARDS) {
                s.spawn("families", || loop {
                    let t = next.fetch_add(1, Ordering::Relaxed);
                    if t >= SHARDS {
                        break;
                    }
                    let mut maps = std::mem::take(&mut *inputs[t].lock().unwrap());
                    let mut merged = maps.pop().unwrap_or_default();
                    for m in maps {
                        for (h, bucket) in m {
                            let into = merged.entry(h).or_default();
                            for (set, w) in bucket {
                                match into.iter_mut().find(|(s, _)| *s == set) {
                                    Some((_, v)) => *v += w,
                                    None => into.push((set, w)),
                                }
                            }
                        }
                    }
                    let mut v: Vec<(Box<[u32]>, u64)> = merged.into_values().flatten().collect();
                    v.sort_unstable_by(|a, b| a.0.len().cmp(&b.0.len()).then_with(|| a.0.cmp(&b.0)));
                    *sorted[t].lock().unwrap() = v;
                });
            }
        });
        let runs: Vec<Vec<(Box<[u32]>, u64)>> = sorted.into_iter().map(|m| m.into_inner().unwrap()).collect();
        merge_sorted_runs(runs)
    }
}

/// k-way merge of runs sorted by (size, elements) into one [`DistinctSets`].
fn merge_sorted_runs(runs: Vec<Vec<(Box<[u32]>, u64)>>) -> DistinctSets {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    let total: usize = runs.iter().map(|r| r.len()).sum();
    let elems: usize = runs.iter().flatten().map(|(s, _)| s.len()).sum();
    let mut out = DistinctSets {
        offsets: Vec::with_capacity(total + 1),
        elements: Vec::with_capacity(elems),
        frequency: Vec::with_capacity(total),
    };
    out.offsets.push(0);
    let mut iters: Vec<std::vec::IntoIter<(Box<[u32]>, u64)>> = runs.into_iter().map(|r| r.into_iter()).collect();
    let mut heap = BinaryHeap::new();
    for (r, it) in iters.iter_mut().enumerate() {
        if let Some((s, w)) = it.next() {
            heap.push(Reverse((s.len(), s, w, r)));
        }
    }
    while let Some(Reverse((_, s, w, r))) = heap.pop() {
        out.elements.extend_from_slice(&s);
        out.offsets.push(out.elements.len());
        out.frequency.push(w);
        if let Some((s, w)) = iters[r].next() {
            heap.push(Reverse((s.len(), s, w, r)));
        }
    }
    out
}

/// I with frequencies, on all host cores (CPU twin of [`distinct_gpu`]).
pub fn distinct_cpu(space: &PairSpace) -> DistinctSets {
    let inv = InvertedLists::of_space(space);
    let k = space.left.len();
    let tasks: Vec<Range<usize>> =
        (0..k).step_by(LEFT_SETS_PER_TASK).map(|s| s..(s + LEFT_SETS_PER_TASK).min(k)).collect();
    let next = AtomicUsize::new(0);
    let workers = threads().min(tasks.len()).max(1);
    let parts: Vec<Shards> = crate::host::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn("families", || {
                    let mut walk = Walk::new(space.right.len());
                    let mut buf = Vec::new();
                    let mut shards = Shards::new();
                    loop {
                        let t = next.fetch_add(1, Ordering::Relaxed);
                        let Some(range) = tasks.get(t) else { break };
                        for i in range.clone() {
                            walk.intersections(space, &inv, i, &mut buf, |_, elems| shards.add(elems, 1));
                        }
                    }
                    shards
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("families worker panicked")).collect()
    });
    Shards::merge(parts)
}

/// Brute force over every pair with sorted-list intersection: the tests' reference.
pub fn pairs_brute_force(space: &PairSpace) -> PairIntersections {
    let mut out = PairIntersections::new();
    for i in 0..space.left.len() {
        for j in space.first_right(i)..space.right.len() {
            let (a, b) = (space.left.set(i), space.right.set(j));
            let common: Vec<u32> = a.iter().copied().filter(|e| b.binary_search(e).is_ok()).collect();
            if !common.is_empty() {
                out.left.push(i as u32);
                out.right.push(j as u32);
                out.elements.extend_from_slice(&common);
                out.offsets.push(out.elements.len());
            }
        }
    }
    out
}

/// Distinct sets with frequencies of a list of intersections (the tests'
/// reference, and the host's final duplicate removal across device slices).
pub fn distinct_of(parts: &[&PairIntersections]) -> DistinctSets {
    let mut shards = Shards::new();
    for p in parts {
        for s in 0..p.len() {
            shards.add(p.set(s), 1);
        }
    }
    Shards::merge(vec![shards])
}

// ---------------------------------------------------------------------------
// GPU backend: kernels/families.cu
// ---------------------------------------------------------------------------

/// kernels/families.cu, with its contract constants as `-D` options.
pub static KERNEL: crate::gpu::KernelSource = crate::gpu::KernelSource {
    family: "families",
    source: include_str!("../../kernels/families.cu"),
    defines: families_defines,
};

fn families_defines() -> Vec<(String, u64)> {
    vec![("FAM_THREADS".into(), FAM_THREADS as u64)]
}

/// Threads per block of the warp-per-left-set kernels (FAM_THREADS).
const FAM_THREADS: u32 = 256;
/// Warps per block of those kernels.
const WARPS_PER_BLOCK: usize = FAM_THREADS as usize / 32;

/// Bytes of device memory one slice needs per pair of its matrix (the count
/// matrix, u32) and per non-empty pair (right set, element offset, fill
/// cursor, group slot, up to four hash-table slots of key, first member and
/// frequency, a group's pair, frequency and position, and its ordering key
/// and rank with the radix sort's second buffers); per element, its
/// slot in the slice and in the gathered distinct sets.
const BYTES_PER_PAIR: usize = 4;
const BYTES_PER_NONEMPTY: usize = 4 + 8 + 4 + 4 + 4 * (8 + 4 + 8) + (4 + 8 + 8) + 2 * (8 + 4);

fn warp_grid(sets: usize) -> LaunchConfig {
    let blocks = sets.div_ceil(WARPS_PER_BLOCK).max(1) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (FAM_THREADS, 1, 1), shared_mem_bytes: 0 }
}

fn thread_grid(gpu: &Gpu, n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(FAM_THREADS as usize).clamp(1, gpu.info().multiprocessors.max(1) as usize * 32) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (FAM_THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// Both families and the right family's inverted lists, resident on the
/// device for every slice.
struct DeviceFamilies {
    left_offsets: DeviceBuffer<u64>,
    left_elements: DeviceBuffer<u32>,
    right_from: DeviceBuffer<u32>,
    inv_offsets: DeviceBuffer<u32>,
    inv_sets: DeviceBuffer<u32>,
    k_right: usize,
    self_form: bool,
    domain: usize,
}

impl DeviceFamilies {
    fn upload(gpu: &Gpu, space: &PairSpace, inv: &InvertedLists, ts: &mut TransferStats) -> Result<DeviceFamilies> {
        let offs: Vec<u64> = space.left.offsets.iter().map(|&o| o as u64).collect();
        let from: Vec<u32> = space.right_from.map_or_else(|| vec![0], |f| f.to_vec());
        Ok(DeviceFamilies {
            left_offsets: gpu.upload(&offs, ts)?,
            left_elements: gpu.upload(nonempty(&space.left.elements), ts)?,
            right_from: gpu.upload(&from, ts)?,
            inv_offsets: gpu.upload(&inv.offsets, ts)?,
            inv_sets: gpu.upload(nonempty(&inv.sets), ts)?,
            k_right: space.right.len(),
            self_form: space.right_from.is_some(),
            domain: inv.offsets.len().saturating_sub(1),
        })
    }
}

/// A device buffer may not be empty: an empty input travels as one zero.
fn nonempty(v: &[u32]) -> &[u32] {
    if v.is_empty() {
        &[0]
    } else {
        v
    }
}

/// One slice of left sets after count, compaction and fill, on the device.
struct Slice {
    rows: Range<usize>,
    /// Per non-empty pair: its right set, and where its elements start.
    right: DeviceBuffer<u32>,
    pair_offsets: DeviceBuffer<u64>,
    elements: DeviceBuffer<u32>,
    /// Host copies of the per-left-set totals (pairs and elements, exclusive scans).
    row_pairs: Vec<u64>,
    pairs: usize,
    total_elements: usize,
    /// The element domain's size (element ids lie below it).
    domain: usize,
}

/// The largest number of left sets per slice whose pair matrix fits a
/// quarter of the budget (the rest is for the slice's non-empty pairs).
fn slice_rows(budget: usize, k_right: usize) -> usize {
    (budget / 4 / (BYTES_PER_PAIR * k_right.max(1))).max(1)
}

/// Count, compact and fill the pairs of left sets `rows` on the device.
fn run_slice(gpu: &Gpu, dev: &DeviceFamilies, rows: Range<usize>, ts: &mut TransferStats) -> Result<Slice> {
    let stream = gpu.stream();
    let nrows = rows.len();
    let k = dev.k_right;
    let (first, nrows_u, k_u, self_u) = (rows.start as u64, nrows as u64, k as u64, dev.self_form as u32);
    let matrix = gpu.alloc_zeros::<u32>(nrows * k)?;
    let row_totals = gpu.alloc_zeros::<u64>(2 * nrows)?;
    let started = Instant::now();
    // 1. Count every pair's intersection size (a warp per left set).
    let f = gpu.function(&KERNEL, "fam_count")?;
    let mut b = stream.launch_builder(&f);
    b.arg(&dev.left_offsets.slice).arg(&dev.left_elements.slice).arg(&first).arg(&nrows_u);
    b.arg(&dev.right_from.slice).arg(&self_u).arg(&dev.inv_offsets.slice).arg(&dev.inv_sets.slice).arg(&k_u);
    b.arg(&matrix.slice);
    // SAFETY: matches fam_count in kernels/families.cu; matrix holds nrows * k counters; the left rows, right_from
    // (one entry per left set in the self form) and the inverted lists are the uploaded families'.
    unsafe { b.launch(warp_grid(nrows)) }.map_err(|e| cuda_err("families fam_count", e))?;
    // 2. Per left set: its non-empty pairs and their elements.
    let f = gpu.function(&KERNEL, "fam_row_totals")?;
    let mut b = stream.launch_builder(&f);
    b.arg(&matrix.slice).arg(&nrows_u).arg(&k_u).arg(&row_totals.slice);
    // SAFETY: matches fam_row_totals; row_totals holds 2 * nrows counters.
    unsafe { b.launch(warp_grid(nrows)) }.map_err(|e| cuda_err("families fam_row_totals", e))?;
    gpu.synchronize()?;
    ts.kernel += started.elapsed();
    trace_step("count + row totals", started);
    let totals = gpu.download(&row_totals, 2 * nrows, ts)?;
    // Exclusive scans on the host: one entry per left set of the slice.
    let mut bases = vec![0u64; 2 * nrows];
    let (mut pairs, mut elems) = (0u64, 0u64);
    for r in 0..nrows {
        bases[2 * r] = pairs;
        bases[2 * r + 1] = elems;
        pairs += totals[2 * r];
        elems += totals[2 * r + 1];
    }
    let (pairs, elems) = (pairs as usize, elems as usize);
    if pairs >= (u32::MAX / 2) as usize {
        // Pair numbers are u32 (the matrix holds them); the caller halves the slice.
        return Err(crate::gpu::GpuError::over_budget(
            format!("intersect_families slice of {nrows} sets ({pairs} non-empty pairs, over u32 pair numbers)"),
            usize::MAX,
            0,
        )
        .into());
    }
    let need = pairs * BYTES_PER_NONEMPTY + elems * 8;
    if need > gpu.budget().available() {
        return Err(crate::gpu::GpuError::over_budget(
            format!("intersect_families slice of {nrows} sets"),
            need,
            gpu.budget().available(),
        )
        .into());
    }
    let d_bases = gpu.upload(&bases, ts)?;
    let right = gpu.alloc::<u32>(pairs.max(1))?;
    let pair_offsets = gpu.alloc::<u64>(pairs + 1)?;
    let elements = gpu.alloc::<u32>(elems.max(1))?;
    let started = Instant::now();
    // 3. Compact: each non-empty pair's right set and element offset; the
    //    matrix entry becomes the pair's number for the fill.
    let f = gpu.function(&KERNEL, "fam_compact")?;
    let mut b = stream.launch_builder(&f);
    let (pairs_u, elems_u) = (pairs as u64, elems as u64);
    b.arg(&matrix.slice).arg(&nrows_u).arg(&k_u).arg(&d_bases.slice).arg(&right.slice).arg(&pair_offsets.slice);
    b.arg(&pairs_u).arg(&elems_u);
    // SAFETY: matches fam_compact; the bases are exclusive scans of fam_row_totals' counts, so every write lies
    // below `pairs` (right, pair_offsets) and pair_offsets has pairs + 1 entries.
    unsafe { b.launch(warp_grid(nrows)) }.map_err(|e| cuda_err("families fam_compact", e))?;
    // 4. Fill, in element order (intersections come out sorted).
    let cursor = gpu.alloc_zeros::<u32>(pairs.max(1))?;
    let f = gpu.function(&KERNEL, "fam_fill")?;
    let mut b = stream.launch_builder(&f);
    b.arg(&dev.left_offsets.slice).arg(&dev.left_elements.slice).arg(&first).arg(&nrows_u);
    b.arg(&dev.right_from.slice).arg(&self_u).arg(&dev.inv_offsets.slice).arg(&dev.inv_sets.slice).arg(&k_u);
    b.arg(&matrix.slice).arg(&pair_offsets.slice).arg(&cursor.slice).arg(&elements.slice);
    // SAFETY: matches fam_fill; it walks the same pairs as fam_count, so each pair receives exactly its counted
    // number of elements at its offset inside `elements`.
    unsafe { b.launch(warp_grid(nrows)) }.map_err(|e| cuda_err("families fam_fill", e))?;
    gpu.synchronize()?;
    ts.kernel += started.elapsed();
    trace_step(&format!("compact + fill ({pairs} pairs, {elems} elements)"), started);
    let row_pairs: Vec<u64> = (0..nrows).map(|r| bases[2 * r]).chain(std::iter::once(pairs as u64)).collect();
    Ok(Slice { rows, right, pair_offsets, elements, row_pairs, pairs, total_elements: elems, domain: dev.domain })
}

impl Slice {
    /// The slice's pairs on the host.
    fn download(&self, gpu: &Gpu, ts: &mut TransferStats) -> Result<PairIntersections> {
        let right = gpu.download(&self.right, self.pairs, ts)?;
        let offsets: Vec<usize> =
            gpu.download(&self.pair_offsets, self.pairs + 1, ts)?.into_iter().map(|o| o as usize).collect();
        let elements = gpu.download(&self.elements, self.total_elements, ts)?;
        let mut left = Vec::with_capacity(self.pairs);
        for (r, w) in self.row_pairs.windows(2).enumerate() {
            left.extend(std::iter::repeat_n((self.rows.start + r) as u32, (w[1] - w[0]) as usize));
        }
        Ok(PairIntersections { left, right, offsets, elements })
    }

    /// Duplicate removal on the device: the slice's distinct sets with
    /// frequencies, ordered by their keys, left on the device; `None` on a
    /// hash collision.
    fn distinct(&self, gpu: &Gpu, ts: &mut TransferStats) -> Result<Option<Groups>> {
        let n = self.pairs;
        if n == 0 {
            return Ok(Some(Groups::default()));
        }
        let stream = gpu.stream();
        let slots = (2 * n).next_power_of_two();
        let (n_u, slots_u) = (n as u64, slots as u64);
        let slot_of = gpu.alloc::<u32>(n)?;
        let keys = gpu.alloc_zeros::<u64>(slots)?;
        let first = gpu.alloc_zeros::<u32>(slots)?;
        let freq = gpu.alloc_zeros::<u64>(slots)?;
        // collisions, distinct sets, their elements, gather cursor
        let counters = gpu.alloc_zeros::<u64>(4)?;
        let started = Instant::now();
        let f = gpu.function(&KERNEL, "fam_group")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&self.pair_offsets.slice).arg(&self.elements.slice).arg(&n_u).arg(&slot_of.slice);
        b.arg(&keys.slice).arg(&first.slice).arg(&slots_u);
        // SAFETY: matches fam_group; slot_of has n entries, keys and first `slots` (a power of two of at least
        // 2n, so the open-addressing table never fills), both zeroed.
        unsafe { b.launch(thread_grid(gpu, n)) }.map_err(|e| cuda_err("families fam_group", e))?;
        let f = gpu.function(&KERNEL, "fam_group_verify")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&self.pair_offsets.slice).arg(&self.elements.slice).arg(&n_u).arg(&slot_of.slice).arg(&first.slice);
        b.arg(&freq.slice).arg(&counters.slice);
        // SAFETY: matches fam_group_verify; first[slot] encodes a pair number below n for every used slot.
        unsafe { b.launch(thread_grid(gpu, n)) }.map_err(|e| cuda_err("families fam_group_verify", e))?;
        drop((keys, slot_of));
        let group_pair = gpu.alloc::<u32>(n)?;
        let group_freq = gpu.alloc::<u64>(n)?;
        let f = gpu.function(&KERNEL, "fam_group_compact")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&self.pair_offsets.slice).arg(&first.slice).arg(&freq.slice).arg(&slots_u);
        b.arg(&group_pair.slice).arg(&group_freq.slice).arg(&counters.slice);
        // SAFETY: matches fam_group_compact; there are at most n groups, the length of group_pair and group_freq.
        unsafe { b.launch(thread_grid(gpu, slots)) }.map_err(|e| cuda_err("families fam_group_compact", e))?;
        gpu.synchronize()?;
        ts.kernel += started.elapsed();
        trace_step("group + verify + compact", started);
        let c = gpu.download(&counters, 4, ts)?;
        if c[0] != 0 {
            return Ok(None);
        }
        drop((first, freq));
        let (groups, total) = (c[1] as usize, c[2] as usize);
        let group_pos = gpu.alloc::<u64>(groups.max(1))?;
        let gathered = gpu.alloc::<u32>(total.max(1))?;
        let started = Instant::now();
        let groups_u = groups as u64;
        let f = gpu.function(&KERNEL, "fam_gather")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&self.pair_offsets.slice).arg(&self.elements.slice).arg(&groups_u).arg(&group_pair.slice);
        b.arg(&group_pos.slice).arg(&gathered.slice).arg(&counters.slice);
        // SAFETY: matches fam_gather; the groups' sizes sum to `total` (counted by fam_group_compact), the
        // length of gathered; group_pos has `groups` entries.
        unsafe { b.launch(thread_grid(gpu, groups)) }.map_err(|e| cuda_err("families fam_gather", e))?;
        gpu.synchronize()?;
        ts.kernel += started.elapsed();
        trace_step(&format!("gather ({groups} groups)"), started);
        // Order the groups by (size, elements) on the device: a radix sort of packed keys.
        let started = Instant::now();
        let bits = (32 - (self.domain.max(2) as u32 - 1).leading_zeros()).max(1);
        let mut keys = gpu.alloc::<u64>(groups.max(1))?;
        let mut order = gpu.alloc::<u32>(groups.max(1))?;
        let f = gpu.function(&KERNEL, "fam_order_keys")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&groups_u)
            .arg(&group_pos.slice)
            .arg(&group_pair.slice)
            .arg(&gathered.slice)
            .arg(&bits)
            .arg(&keys.slice)
            .arg(&order.slice);
        // SAFETY: matches fam_order_keys; group_pos / group_pair (now the sizes) and keys / order have `groups`
        // entries, and every group's elements lie inside gathered.
        unsafe { b.launch(thread_grid(gpu, groups)) }.map_err(|e| cuda_err("families fam_order_keys", e))?;
        if groups > 1 {
            super::radix_sort::sort_pairs_u64(gpu, &mut keys, &mut order, groups, 0, 64)?;
        }
        gpu.synchronize()?;
        ts.kernel += started.elapsed();
        trace_step("device order", started);
        Ok(Some(Groups {
            on_device: Some(DeviceGroups {
                pos: group_pos,
                len: group_pair,
                freq: group_freq,
                elements: gathered,
                keys,
                order,
            }),
            groups,
            total,
            key_elements: 48 / bits,
            domain: self.domain,
        }))
    }
}

/// A slice's distinct sets on the device: set `d` is
/// `elements[pos[d]..pos[d] + len[d]]` with frequency `freq[d]`; `keys`
/// ascending and `order` the sets in that order (see [`FlatDistinct`]).
struct DeviceGroups {
    pos: DeviceBuffer<u64>,
    len: DeviceBuffer<u32>,
    freq: DeviceBuffer<u64>,
    elements: DeviceBuffer<u32>,
    keys: DeviceBuffer<u64>,
    order: DeviceBuffer<u32>,
}

/// [`DeviceGroups`] with their sizes (`on_device` None: no set).
#[derive(Default)]
struct Groups {
    on_device: Option<DeviceGroups>,
    groups: usize,
    total: usize,
    key_elements: u32,
    /// The element domain's size (element ids lie below it).
    domain: usize,
}

impl Groups {
    /// The sets on the host, for the duplicate removal across slices.
    fn download(self, gpu: &Gpu, ts: &mut TransferStats) -> Result<FlatDistinct> {
        let Some(d) = self.on_device else { return Ok(FlatDistinct::default()) };
        let (groups, started) = (self.groups, Instant::now());
        let flat = FlatDistinct {
            pos: gpu.download(&d.pos, groups, ts)?,
            len: gpu.download(&d.len, groups, ts)?,
            freq: gpu.download(&d.freq, groups, ts)?,
            elements: gpu.download(&d.elements, self.total, ts)?,
            keys: gpu.download(&d.keys, groups, ts)?,
            order: gpu.download(&d.order, groups, ts)?,
            key_elements: self.key_elements,
        };
        trace_step("download", started);
        Ok(flat)
    }

    /// The output columns, in order, written by the device and downloaded
    /// once into pinned memory that Arrow buffers own: no host pass over the
    /// sets, but for ordering those whose keys tie ([`order_ties`]). Element
    /// id `e` is output as `id_values[e] ^ flip`; the caller keeps `total`
    /// within i32 offsets.
    fn columns(self, gpu: &Gpu, id_values: &[u64], flip: u64, ts: &mut TransferStats) -> Result<DistinctColumns> {
        let Some(d) = self.on_device else { return DistinctColumns::from_vecs(vec![0], Vec::new(), Vec::new()) };
        let (n, total) = (self.groups, self.total);
        if id_values.len() < self.domain {
            return Err(DataFusionError::Internal(format!(
                "families: {} output values for a domain of {} element ids",
                id_values.len(),
                self.domain
            )));
        }
        let stream = gpu.stream();
        let started = Instant::now();
        let out_len = gpu.alloc::<u32>(n)?;
        let out_freq = gpu.alloc::<u64>(n)?;
        let ties = gpu.alloc_zeros::<u64>(1)?;
        let tie_cap = n.min(TIE_MARKS);
        let tie_at = gpu.alloc::<u32>(tie_cap)?;
        let (n_u, cap, tie_cap_u) = (n as u64, self.key_elements, tie_cap as u64);
        let f = gpu.function(&KERNEL, "fam_out_order")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&n_u).arg(&d.order.slice).arg(&d.len.slice).arg(&d.freq.slice).arg(&d.keys.slice).arg(&cap);
        b.arg(&out_len.slice).arg(&out_freq.slice).arg(&ties.slice).arg(&tie_at.slice).arg(&tie_cap_u);
        // SAFETY: matches fam_out_order; order, len, freq, keys, out_len and out_freq hold n entries, tie_at
        // tie_cap (the kernel writes no more).
        unsafe { b.launch(thread_grid(gpu, n)) }.map_err(|e| cuda_err("families fam_out_order", e))?;
        let offsets = super::segmented::exclusive_scan(gpu, &out_len, n)?;
        let ids = gpu.upload(id_values, ts)?;
        let values = gpu.alloc::<u64>(total.max(1))?;
        let f = gpu.function(&KERNEL, "fam_out_values")?;
        let mut b = stream.launch_builder(&f);
        b.arg(&n_u).arg(&d.order.slice).arg(&d.pos.slice).arg(&offsets.slice).arg(&d.elements.slice);
        b.arg(&ids.slice).arg(&flip).arg(&values.slice);
        // SAFETY: matches fam_out_values; offsets hold n + 1 entries whose last is `total` (the sum of the
        // sets' sizes, the length of values), every element id is below the domain, checked above to be at
        // most the length of id_values.
        unsafe { b.launch(thread_grid(gpu, n)) }.map_err(|e| cuda_err("families fam_out_values", e))?;
        gpu.synchronize()?;
        ts.kernel += started.elapsed();
        trace_step("output columns", started);
        let started = Instant::now();
        let ties = gpu.read_one(&ties, 0, ts)?;
        let (ob, vb, fb) = ((n + 1) * 4, total * 8, n * 8);
        let (mut oh, mut vh, mut fh) = (gpu.host_output(ob)?, gpu.host_output(vb)?, gpu.host_output(fb)?);
        // SAFETY: the three are pinned (host_output) and untouched until the synchronisation below.
        unsafe {
            gpu.download_async_into(&offsets, n + 1, oh.as_mut_slice()?)?;
            gpu.download_async_into(&values, total, vh.as_mut_slice()?)?;
            gpu.download_async_into(&out_freq, n, fh.as_mut_slice()?)?;
        }
        gpu.synchronize()?;
        ts.bytes_to_host += ob + vb + fb;
        ts.to_host += started.elapsed();
        trace_step("download", started);
        if ties > 0 {
            let started = Instant::now();
            let ties = ties as usize;
            let runs = if ties <= tie_cap {
                // The marks alone (a few thousand at k = 50,000): their runs.
                let mut at = gpu.download(&tie_at, ties, ts)?;
                at.sort_unstable();
                tie_runs_of_marks(&at)
            } else {
                let keys = gpu.download(&d.keys, n, ts)?;
                let lens = gpu.download(&out_len, n, ts)?;
                tie_runs_of_keys(&keys, &lens, cap)
            };
            let (o, v, f) = (oh.as_mut_slice()?, vh.as_mut_slice()?, fh.as_mut_slice()?);
            // SAFETY: pinned memory is page aligned, the DMA above wrote these lengths, and every bit
            // pattern is a valid i32 / u64.
            let (o, v, f) = unsafe {
                (
                    std::slice::from_raw_parts_mut(o.as_mut_ptr() as *mut i32, n + 1),
                    std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u64, total),
                    std::slice::from_raw_parts_mut(f.as_mut_ptr() as *mut u64, n),
                )
            };
            order_ties(o, v, f, &runs, flip);
            trace_step(&format!("host order of {ties} tied neighbours"), started);
        }
        Ok(DistinctColumns {
            offsets: oh.into_buffer(ob)?,
            values: vh.into_buffer(vb)?,
            frequency: fh.into_buffer(fb)?,
            len: n,
        })
    }
}

/// Distinct sets as the device leaves them: set `d` is
/// `elements[pos[d]..pos[d] + len[d]]`, and the device's sort of them:
/// `keys` (the ordering keys, ascending), `order` (the sets in that order)
/// and `key_elements` (how many leading elements a key holds).
#[derive(Debug, Default)]
struct FlatDistinct {
    pos: Vec<u64>,
    len: Vec<u32>,
    freq: Vec<u64>,
    elements: Vec<u32>,
    keys: Vec<u64>,
    order: Vec<u32>,
    key_elements: u32,
}

impl FlatDistinct {
    fn set(&self, d: usize) -> &[u32] {
        &self.elements[self.pos[d] as usize..self.pos[d] as usize + self.len[d] as usize]
    }

    /// Ordered by (size, elements): the device's order, with ties among sets
    /// longer than their keys ordered here.
    fn into_sorted(mut self) -> DistinctSets {
        let (keys, mut order, cap) =
            (std::mem::take(&mut self.keys), std::mem::take(&mut self.order), self.key_elements);
        let mut start = 0;
        while start < keys.len() {
            let mut end = start + 1;
            while end < keys.len() && keys[end] == keys[start] {
                end += 1;
            }
            if end - start > 1 && self.len[order[start] as usize] > cap {
                order[start..end].sort_unstable_by(|&a, &b| {
                    let (x, y) = (self.set(a as usize), self.set(b as usize));
                    x.len().cmp(&y.len()).then_with(|| x.cmp(y))
                });
            }
            start = end;
        }
        // Gathering the sets in order reads them at random: chunks of the order on all cores,
        // then one sequential concatenation (26M sets: 3.0-3.5 s on one H100 host core).
        let per = order.len().div_ceil(threads().max(1)).max(1 << 16);
        let parts: Vec<(Vec<u32>, Vec<u32>, Vec<u64>)> = crate::host::scope(|s| {
            let handles: Vec<_> = order
                .chunks(per)
                .map(|chunk| {
                    let this = &self;
                    s.spawn("families", move || {
                        let (mut elems, mut lens, mut freqs) =
                            (Vec::new(), Vec::with_capacity(chunk.len()), Vec::with_capacity(chunk.len()));
                        for &d in chunk {
                            let set = this.set(d as usize);
                            elems.extend_from_slice(set);
                            lens.push(set.len() as u32);
                            freqs.push(this.freq[d as usize]);
                        }
                        (elems, lens, freqs)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("families output worker panicked")).collect()
        });
        let n = order.len();
        let mut out = DistinctSets {
            offsets: Vec::with_capacity(n + 1),
            elements: Vec::with_capacity(self.elements.len()),
            frequency: Vec::with_capacity(n),
        };
        out.offsets.push(0);
        for (elems, lens, freqs) in parts {
            let mut at = out.elements.len();
            out.offsets.extend(lens.iter().map(|&l| {
                at += l as usize;
                at
            }));
            out.elements.extend_from_slice(&elems);
            out.frequency.extend_from_slice(&freqs);
        }
        out
    }
}

/// The intersection sizes of the pairs of left sets `rows`, on the device by
/// the right family's inverted lists (`fam_count`, seed 004's sf-gSSJoin
/// counting): a row-major `rows.len() x k_right` matrix whose entries outside
/// the pair space (the self form's j < `first_right(i)`) are 0. Slices of
/// left sets whose count matrices fit the budget run one after another.
pub fn pair_counts_gpu(
    gpu: &Gpu,
    space: &PairSpace,
    inv: &InvertedLists,
    rows: Range<usize>,
    ts: &mut TransferStats,
) -> Result<Vec<u32>> {
    let k = space.right.len();
    let mut out = vec![0u32; rows.len() * k];
    if rows.is_empty() || k == 0 {
        return Ok(out);
    }
    let dev = DeviceFamilies::upload(gpu, space, inv, ts)?;
    let (k_u, self_u) = (k as u64, dev.self_form as u32);
    for r in slices(gpu, space, rows.clone(), resident_bytes(space, inv)) {
        let (first, nrows) = (r.start as u64, r.len() as u64);
        let matrix = gpu.alloc_zeros::<u32>(r.len() * k)?;
        let started = Instant::now();
        let f = gpu.function(&KERNEL, "fam_count")?;
        let mut b = gpu.stream().launch_builder(&f);
        b.arg(&dev.left_offsets.slice).arg(&dev.left_elements.slice).arg(&first).arg(&nrows);
        b.arg(&dev.right_from.slice).arg(&self_u).arg(&dev.inv_offsets.slice).arg(&dev.inv_sets.slice).arg(&k_u);
        b.arg(&matrix.slice);
        // SAFETY: matches fam_count in kernels/families.cu; matrix holds nrows * k counters; the left rows,
        // right_from (one entry per left set in the self form) and the inverted lists are the uploaded families'.
        unsafe { b.launch(warp_grid(r.len())) }.map_err(|e| cuda_err("families fam_count", e))?;
        gpu.synchronize()?;
        ts.kernel += started.elapsed();
        let at = (r.start - rows.start) * k;
        gpu.download_into(&matrix, &mut out[at..at + r.len() * k], ts)?;
    }
    Ok(out)
}

/// Left-set slices whose pair matrices fit the device budget.
fn slices(gpu: &Gpu, space: &PairSpace, rows: Range<usize>, resident: usize) -> Vec<Range<usize>> {
    let budget = gpu.budget().available().saturating_sub(resident);
    let per = slice_rows(budget, space.right.len());
    (rows.start..rows.end).step_by(per).map(|s| s..(s + per).min(rows.end)).collect()
}

fn resident_bytes(space: &PairSpace, inv: &InvertedLists) -> usize {
    space.left.offsets.len() * 8
        + space.left.elements.len() * 4
        + space.left.len() * 4
        + inv.offsets.len() * 4
        + inv.sets.len() * 4
}

/// Run `per_slice` over slices of `rows`, halving a slice whose non-empty
/// pairs do not fit the budget.
fn for_each_slice(
    gpu: &Gpu,
    space: &PairSpace,
    inv: &InvertedLists,
    rows: Range<usize>,
    ts: &mut TransferStats,
    per_slice: &mut dyn FnMut(&Gpu, Slice, bool, &mut TransferStats) -> Result<()>,
) -> Result<usize> {
    let started = Instant::now();
    let dev = DeviceFamilies::upload(gpu, space, inv, ts)?;
    trace_step("upload", started);
    let mut todo: Vec<Range<usize>> = slices(gpu, space, rows, resident_bytes(space, inv));
    todo.reverse();
    let mut done = 0;
    while let Some(r) = todo.pop() {
        match run_slice(gpu, &dev, r.clone(), ts) {
            Ok(slice) => {
                // The only slice: the first to run, and none left.
                let only = done == 0 && todo.is_empty();
                per_slice(gpu, slice, only, ts)?;
                done += 1;
            }
            Err(e) if crate::gpu::is_out_of_memory(&e) && r.len() > 1 => {
                let mid = r.start + r.len() / 2;
                todo.push(mid..r.end);
                todo.push(r.start..mid);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// I_r for the left sets in `rows`, on the device (GPU twin of [`pairs_cpu`]).
pub fn pairs_gpu(
    gpu: &Gpu,
    space: &PairSpace,
    rows: Range<usize>,
    ts: &mut TransferStats,
) -> Result<PairIntersections> {
    pairs_gpu_with(gpu, space, &InvertedLists::of_space(space), rows, ts)
}

/// [`pairs_gpu`] with the right family's inverted lists already built.
pub fn pairs_gpu_with(
    gpu: &Gpu,
    space: &PairSpace,
    inv: &InvertedLists,
    rows: Range<usize>,
    ts: &mut TransferStats,
) -> Result<PairIntersections> {
    let mut all = PairIntersections::new();
    if rows.is_empty() || space.right.is_empty() {
        return Ok(all);
    }
    for_each_slice(gpu, space, inv, rows, ts, &mut |gpu, slice, _, ts| {
        all.append(&slice.download(gpu, ts)?);
        Ok(())
    })?;
    Ok(all)
}

/// I with frequencies, on the device (GPU twin of [`distinct_cpu`]), as
/// [`DistinctSets`] of element ids. Returns the sets and the number of slices.
pub fn distinct_gpu(gpu: &Gpu, space: &PairSpace, ts: &mut TransferStats) -> Result<(DistinctSets, usize)> {
    let ids: Vec<u64> = (0..space.domain() as u64).collect();
    let (out, n) = distinct_gpu_columns(gpu, space, &ids, 0, ts)?;
    Ok((out.into_sets(), n))
}

/// I with frequencies, on the device. When one slice holds every pair and no
/// hash collides, as output columns the device lays out in I's order (element
/// id `e` as `id_values[e] ^ flip`; `id_values` ascending, one per id below
/// the domain); else as [`DistinctSets`] of element ids, the slices' sets
/// merged on the host. Returns the number of slices too.
pub fn distinct_gpu_columns(
    gpu: &Gpu,
    space: &PairSpace,
    id_values: &[u64],
    flip: u64,
    ts: &mut TransferStats,
) -> Result<(DistinctOut, usize)> {
    let started = Instant::now();
    let inv = InvertedLists::of_space(space);
    trace_step("inverted lists", started);
    if space.left.is_empty() || space.right.is_empty() {
        return Ok((DistinctOut::Sets(DistinctSets { offsets: vec![0], ..Default::default() }), 0));
    }
    let mut parts: Vec<FlatDistinct> = Vec::new();
    let mut columns: Option<DistinctColumns> = None;
    let mut collided = Shards::new();
    let n = for_each_slice(gpu, space, &inv, 0..space.left.len(), ts, &mut |gpu, slice, only, ts| {
        match slice.distinct(gpu, ts)? {
            Some(groups) if only && groups.total <= i32::MAX as usize && !crate::env::families_host_output() => {
                columns = Some(groups.columns(gpu, id_values, flip, ts)?)
            }
            Some(groups) => parts.push(groups.download(gpu, ts)?),
            None => {
                // A 64-bit hash collision inside the slice: group its pairs exactly on the host.
                let pairs = slice.download(gpu, ts)?;
                for p in 0..pairs.len() {
                    collided.add(pairs.set(p), 1);
                }
            }
        }
        Ok(())
    })?;
    if let Some(c) = columns {
        return Ok((DistinctOut::Columns(c), n));
    }
    let collisions = collided.shards.iter().any(|m| !m.is_empty());
    if parts.len() == 1 && !collisions {
        let started = Instant::now();
        let sorted = parts.pop().unwrap_or_default().into_sorted();
        trace_step("host order", started);
        return Ok((DistinctOut::Sets(sorted), n));
    }
    // The final duplicate removal across slices.
    for flat in &parts {
        for d in 0..flat.freq.len() {
            collided.add(flat.set(d), flat.freq[d]);
        }
    }
    Ok((DistinctOut::Sets(Shards::merge(vec![collided])), n))
}

/// `doctor`'s check: the device matches the CPU twin on the paper's figure 1
/// and on random families, at every level, with forced slicing.
pub fn self_check(gpu: &Gpu) -> Result<String> {
    let (f, g) = tests_data::figure1();
    let space = PairSpace { left: &f, right: &g, right_from: None };
    let mut ts = TransferStats::default();
    let (d, _) = distinct_gpu(gpu, &space, &mut ts)?;
    if d != distinct_cpu(&space) || pairs_gpu(gpu, &space, 0..f.len(), &mut ts)? != pairs_cpu(&space, 0..f.len()) {
        return Err(DataFusionError::Execution("families self-check: figure 1 differs from the CPU twin".into()));
    }
    let (f, g) = tests_data::random(300, 200, 40, 500, 7);
    let space = PairSpace { left: &f, right: &g, right_from: None };
    let (d, _) = distinct_gpu(gpu, &space, &mut ts)?;
    if d != distinct_cpu(&space) || pairs_gpu(gpu, &space, 0..f.len(), &mut ts)? != pairs_cpu(&space, 0..f.len()) {
        return Err(DataFusionError::Execution("families self-check: random families differ from the CPU twin".into()));
    }
    Ok("figure 1 and 300 x 200 random sets match the CPU twin".into())
}

/// Families for tests, the doctor and the benchmark.
pub mod tests_data {
    use super::Family;

    /// A xorshift64 generator: reproducible families without a random crate's versioned streams.
    pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
        let mut s = crate::util::Xorshift64(seed.wrapping_mul(0x9e3779b97f4a7c15) | 1);
        move || s.next_u64()
    }

    /// The paper's figure 1: F and F' (k = 6, k' = 4).
    pub fn figure1() -> (Family, Family) {
        let f =
            Family::from_sets(&[vec![3, 0, 1, 2], vec![5, 1], vec![2, 0, 3], vec![3, 4], vec![1, 3, 2, 5], vec![1]]);
        let g = Family::from_sets(&[vec![1, 4], vec![1, 5, 4], vec![4, 0, 2, 3], vec![5, 3, 4]]);
        (f, g)
    }

    /// Two random families: `k` and `k2` sets of 0 to `max_len` elements over
    /// `domain` ids, with repeated sets.
    pub fn random(k: usize, k2: usize, max_len: usize, domain: u32, seed: u64) -> (Family, Family) {
        let mut next = xorshift(seed);
        let mut fam = |k: usize| {
            let mut sets: Vec<Vec<u32>> = Vec::with_capacity(k);
            for i in 0..k {
                if i > 0 && next() % 8 == 0 {
                    let again = sets[(next() % i as u64) as usize].clone();
                    sets.push(again);
                    continue;
                }
                let len = (next() % (max_len as u64 + 1)) as usize;
                sets.push((0..len).map(|_| (next() % domain as u64) as u32).collect());
            }
            Family::from_sets(&sets)
        };
        let f = fam(k);
        let g = fam(k2);
        (f, g)
    }

    /// The paper's "uniform" families: `k` sets of 100 to 150 elements over a domain of 100,000.
    pub fn uniform(k: usize, seed: u64) -> (Family, Family) {
        let mut next = xorshift(seed);
        let mut fam = |k: usize| {
            let sets: Vec<Vec<u32>> =
                (0..k).map(|_| (0..100 + next() % 51).map(|_| (next() % 100_000) as u32).collect()).collect();
            Family::from_sets(&sets)
        };
        let f = fam(k);
        let g = fam(k);
        (f, g)
    }
}

#[cfg(test)]
mod tests {
    use super::tests_data::{figure1, random};
    use super::*;

    fn distinct_as_vec(d: &DistinctSets) -> Vec<(Vec<u32>, u64)> {
        (0..d.len()).map(|p| (d.set(p).to_vec(), d.frequency[p])).collect()
    }

    #[test]
    fn figure_1_gives_the_papers_nine_sets() {
        let (f, g) = figure1();
        let space = PairSpace { left: &f, right: &g, right_from: None };
        let d = distinct_cpu(&space);
        // Brute-force frequencies of the nine sets of the paper's I (24 pairs, 5 empty).
        let expected: Vec<(Vec<u32>, u64)> = vec![
            (vec![1], 6),
            (vec![3], 2),
            (vec![4], 2),
            (vec![5], 1),
            (vec![1, 5], 2),
            (vec![2, 3], 1),
            (vec![3, 4], 2),
            (vec![3, 5], 1),
            (vec![0, 2, 3], 2),
        ];
        assert_eq!(distinct_as_vec(&d), expected);
        let pairs = pairs_cpu(&space, 0..f.len());
        assert_eq!(pairs, pairs_brute_force(&space));
        assert_eq!(pairs.len(), 24 - 5);
        assert_eq!(distinct_of(&[&pairs]), d);
    }

    #[test]
    fn parallel_inverted_lists_equal_the_serial_ones() {
        for (k, max_len, domain, seed) in
            [(1, 5, 10, 1u64), (50, 500, 2_000, 2), (300, 3_000, 200_000, 3), (40, 0, 10, 4)]
        {
            let (f, _) = tests_data::random(k, 1, max_len, domain, seed);
            let d = f.domain() + 3;
            assert_eq!(InvertedLists::of_parallel(&f, d), InvertedLists::of_serial(&f, d), "k {k} domain {domain}");
        }
    }

    #[test]
    fn random_families_match_brute_force() {
        for seed in 0..12u64 {
            let (f, g) = random(
                40 + seed as usize * 7,
                30 + seed as usize * 5,
                (seed % 4) as usize * 6,
                10 + seed as u32 * 9,
                seed,
            );
            let space = PairSpace { left: &f, right: &g, right_from: None };
            let brute = pairs_brute_force(&space);
            assert_eq!(pairs_cpu(&space, 0..f.len()), brute, "seed {seed}");
            assert_eq!(distinct_cpu(&space), distinct_of(&[&brute]), "seed {seed}");
            // A sub-range of left sets.
            let mid = f.len() / 3;
            let part = pairs_cpu(&space, mid..f.len());
            assert!(part.left.iter().all(|&i| i as usize >= mid));
            assert_eq!(part.len(), brute.left.iter().filter(|&&i| i as usize >= mid).count());
        }
    }

    #[test]
    fn self_form_takes_pairs_after_each_set() {
        let (f, _) = random(60, 1, 8, 20, 3);
        // Sets 2k and 2k + 1 share an id: right_from skips the partner too.
        let from: Vec<u32> = (0..f.len() as u32).map(|i| (i / 2 + 1) * 2).collect();
        let space = PairSpace { left: &f, right: &f, right_from: Some(&from) };
        let brute = pairs_brute_force(&space);
        assert!(brute.left.iter().zip(&brute.right).all(|(&i, &j)| j >= from[i as usize]));
        assert_eq!(pairs_cpu(&space, 0..f.len()), brute);
        assert_eq!(distinct_cpu(&space), distinct_of(&[&brute]));
        assert_eq!(space.pair_count(0..f.len()), (0..60u64).map(|i| 60 - (i / 2 + 1) * 2).sum::<u64>());
    }

    #[test]
    fn empty_families_and_sets() {
        let empty = Family::from_sets::<Vec<u32>>(&[]);
        let (f, _) = figure1();
        let with_empty = Family::from_sets(&[vec![], vec![1, 2], vec![]]);
        for (l, r) in [(&empty, &f), (&f, &empty), (&with_empty, &f), (&f, &with_empty), (&empty, &empty)] {
            let space = PairSpace { left: l, right: r, right_from: None };
            assert_eq!(pairs_cpu(&space, 0..l.len()), pairs_brute_force(&space));
            assert_eq!(distinct_cpu(&space), distinct_of(&[&pairs_brute_force(&space)]));
        }
    }

    /// The host's share of the device's ordering: runs of sets whose keys tie
    /// come out by (size, values), the frequencies with their sets; runs of
    /// sets within a key's reach keep their order; a flip orders signed values.
    #[test]
    fn tied_keys_are_ordered_by_size_then_values() {
        let minus_one = u64::MAX; // -1 as an Int64's bits
        let sets: [(&[u64], u64, u64); 6] = [
            (&[9], 1, 10),
            (&[5, 7, 8], 2, 20),
            (&[5, 6, 9], 2, 21),
            (&[5, 6, 8], 2, 22),
            (&[4, 0], 3, 30),
            (&[4, minus_one], 3, 31),
        ];
        let keys: Vec<u64> = sets.iter().map(|s| s.1).collect();
        let ordered = |cap: u32, flip: u64| -> Vec<(Vec<u64>, u64)> {
            let (mut offsets, mut values) = (vec![0i32], Vec::new());
            for (set, _, _) in &sets {
                values.extend_from_slice(set);
                offsets.push(values.len() as i32);
            }
            let mut frequency: Vec<u64> = sets.iter().map(|s| s.2).collect();
            let lens: Vec<u32> = sets.iter().map(|s| s.0.len() as u32).collect();
            let runs = tie_runs_of_keys(&keys, &lens, cap);
            order_ties(&mut offsets, &mut values, &mut frequency, &runs, flip);
            let c = DistinctColumns::from_vecs(offsets, values, frequency).unwrap();
            (0..c.len).map(|p| (c.set(p).to_vec(), c.frequency()[p])).collect()
        };
        let head = [(vec![9], 10), (vec![5, 6, 8], 22), (vec![5, 6, 9], 21), (vec![5, 7, 8], 20)];
        // cap 1 (a key holds one element): both runs are ordered here, unsigned.
        let got = ordered(1, 0);
        assert_eq!(got[..4], head[..]);
        assert_eq!(got[4..], [(vec![4, 0], 30), (vec![4, minus_one], 31)][..]);
        // Signed (flip): -1 comes before 0.
        let got = ordered(1, 1 << 63);
        assert_eq!(got[..4], head[..]);
        assert_eq!(got[4..], [(vec![4, minus_one], 31), (vec![4, 0], 30)][..]);
        // cap 2: two-element sets are whole in their keys, so their run keeps its order.
        assert_eq!(ordered(2, 1 << 63)[4..], [(vec![4, 0], 30), (vec![4, minus_one], 31)][..]);
        // The device's marks (positions tied to the set before): consecutive marks make one run.
        assert_eq!(tie_runs_of_marks(&[2, 3, 5, 9, 10, 11]), vec![(1, 4), (4, 6), (8, 12)]);
        assert_eq!(tie_runs_of_keys(&keys, &[1, 3, 3, 3, 2, 2], 1), vec![(1, 4), (4, 6)]);
        assert!(tie_runs_of_marks(&[]).is_empty());
    }

    #[test]
    fn gpu_matches_cpu_twin() {
        let Some(gpu) = crate::gpu::test_gpu() else { return };
        let lease = gpu.lease(0);
        let mut ts = TransferStats::default();
        for seed in 0..6u64 {
            let (f, g) = random(500 + seed as usize * 100, 300, 30, 50 + seed as u32 * 400, seed);
            for self_form in [false, true] {
                let from: Vec<u32> = (0..f.len() as u32).map(|i| i + 1).collect();
                let space = if self_form {
                    PairSpace { left: &f, right: &f, right_from: Some(&from) }
                } else {
                    PairSpace { left: &f, right: &g, right_from: None }
                };
                let cpu = pairs_cpu(&space, 0..f.len());
                assert_eq!(pairs_gpu(&lease, &space, 0..f.len(), &mut ts).unwrap(), cpu, "seed {seed}");
                assert_eq!(
                    pairs_gpu(&lease, &space, 7..f.len() / 2, &mut ts).unwrap(),
                    pairs_cpu(&space, 7..f.len() / 2)
                );
                let (d, _) = distinct_gpu(&lease, &space, &mut ts).unwrap();
                assert_eq!(d, distinct_cpu(&space), "seed {seed}");
            }
        }
        // Long intersections over a small domain (many keys tie: the host orders those runs), and the
        // output columns with a signed value image: the CPU twin's sets, mapped, in the same order.
        for (seed, domain) in [(21u64, 24u32), (22, 40)] {
            let (f, g) = random(400, 300, 40, domain, seed);
            let space = PairSpace { left: &f, right: &g, right_from: None };
            let cpu = distinct_cpu(&space);
            assert_eq!(distinct_gpu(&lease, &space, &mut ts).unwrap().0, cpu, "ties, seed {seed}");
            let image: Vec<u64> = (0..space.domain() as u64).map(|i| (i * 3) ^ (1 << 63)).collect();
            let (out, n) = distinct_gpu_columns(&lease, &space, &image, 1 << 63, &mut ts).unwrap();
            let DistinctOut::Columns(c) = out else { panic!("one slice gives columns") };
            assert_eq!((n, c.len, c.frequency()), (1, cpu.len(), cpu.frequency.as_slice()));
            for p in 0..cpu.len() {
                let want: Vec<u64> = cpu.set(p).iter().map(|&e| (e as u64) * 3).collect();
                assert_eq!(c.set(p), want.as_slice(), "set {p}, seed {seed}");
            }
        }
        // Forced slicing: a budget that holds a few left sets' pair matrix at a time.
        drop(lease);
        let (f, g) = random(2000, 3000, 20, 300, 11);
        let space = PairSpace { left: &f, right: &g, right_from: None };
        let lease = gpu.lease(4 << 20);
        // 4 MiB beside what other tests still hold on the device (their buffers outside
        // their leases count against the one budget: 27.5 MB under 4 test threads on an H200).
        lease.budget().set_limit(lease.budget().used() + (4 << 20));
        let (d, n) = distinct_gpu(&lease, &space, &mut ts).unwrap();
        assert!(n > 1, "expected several slices, got {n}");
        assert_eq!(d, distinct_cpu(&space));
        assert_eq!(pairs_gpu(&lease, &space, 0..f.len(), &mut ts).unwrap(), pairs_cpu(&space, 0..f.len()));
    }
}
