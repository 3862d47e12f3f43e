//! Set-similarity join (issue 4): all pairs of sets whose Jaccard, Dice,
//! cosine similarity or overlap reaches a threshold.
//!
//! * **Preprocessing** ([`preprocess`] on the host's cores, or on the device
//!   for the GPU backend; src/algo/ssjoin_prep.rs): elements (u64 keys:
//!   integers, or dictionary ids of strings) become dense u32 token ids
//!   ordered by ascending global document frequency over both inputs (rare
//!   tokens first, so prefixes are selective); every set is sorted and
//!   deduplicated; sets are ordered by size (ties by id).
//! * **CPU backend** ([`ssjoin_cpu`]): a multithreaded PPJoin (AllPairs with
//!   the positional filter): static inverted index over the *index prefixes*
//!   of the indexed side, probe prefixes scanned within the length-filter
//!   window, positional pruning of candidates, merge verification with early
//!   termination. Threads take chunks of probe sets from a shared counter.
//! * **GPU backend** ([`ssjoin_gpu`], kernels/ssjoin.cu): sf-gSSJoin /
//!   fgssjoin style. The CSR inverted index (prefix tokens -> set positions,
//!   sorted by position = by size) lives on the device. A first kernel counts
//!   per probe set the index entries its prefix visits inside its length
//!   window; the host cuts the probe sets into blocks whose count matrix
//!   (block rows x window columns) and candidate buffer fit the free device
//!   memory / `setfusion.memory_limit`. Per block, one CUDA block per probe
//!   set walks the concatenated inverted-list segments of its prefix tokens
//!   (split evenly over the threads) and increments `count[row][y]` with
//!   atomics; the first touch appends `(row, y)` to a candidate list. The
//!   verify kernel resets the counters it read (so the matrix is never
//!   cleared as a whole), merges both sets with early termination, applies
//!   the threshold in double precision and appends `(x, y, overlap)` for
//!   matching pairs only; just those triples return to the host.
//!
//! Exactness: every backend decides a pair with the same predicate
//! [`Threshold::passes`] on `(overlap, |x|, |y|)`, which evaluates the metric
//! from integers with one IEEE division (plus one square root for cosine), the
//! same expression as the SQL functions in `crate::udf` and as the kernel. All
//! filters are derived from that predicate (never from a separately rounded
//! formula), so they only drop pairs the predicate rejects.
//!
//! Similarity of two empty sets is 0 (see `crate::udf`): with a threshold
//! > 0 an empty set never joins.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use datafusion::error::{DataFusionError, Result};

use crate::gpu::{cuda_err, Gpu, TransferStats};

/// A result pair: (id of the R set, id of the S set, overlap). For a self
/// join the first id is the smaller one.
pub type Pair = (u32, u32, u32);

/// The similarity function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    /// |x ∩ y| / |x ∪ y|
    Jaccard = 0,
    /// 2 |x ∩ y| / (|x| + |y|)
    Dice = 1,
    /// |x ∩ y| / sqrt(|x| |y|)
    Cosine = 2,
    /// |x ∩ y|
    Overlap = 3,
}

impl Metric {
    /// The SQL function name.
    pub fn name(&self) -> &'static str {
        match self {
            Metric::Jaccard => "jaccard",
            Metric::Dice => "dice",
            Metric::Cosine => "set_cosine",
            Metric::Overlap => "overlap",
        }
    }

    pub fn from_name(name: &str) -> Option<Metric> {
        match name {
            "jaccard" => Some(Metric::Jaccard),
            "dice" => Some(Metric::Dice),
            "set_cosine" => Some(Metric::Cosine),
            "overlap" => Some(Metric::Overlap),
            _ => None,
        }
    }

    /// The metric's value for overlap `o` of sets of sizes `a` and `b`.
    /// Computed from exact integers with one rounding step (cosine: the
    /// square root and the division), identically on CPU, GPU and in SQL.
    /// Two empty sets (and, for cosine, any empty set) give 0.
    #[inline]
    pub fn value(&self, o: u64, a: u64, b: u64) -> f64 {
        match self {
            Metric::Jaccard => {
                let den = a + b - o;
                if den == 0 {
                    0.0
                } else {
                    o as f64 / den as f64
                }
            }
            Metric::Dice => {
                let den = a + b;
                if den == 0 {
                    0.0
                } else {
                    (2 * o) as f64 / den as f64
                }
            }
            Metric::Cosine => {
                let p = a * b;
                if p == 0 {
                    0.0
                } else {
                    o as f64 / (p as f64).sqrt()
                }
            }
            Metric::Overlap => o as f64,
        }
    }

    /// Is `t` a valid join threshold for this metric? `Err` says why not.
    pub fn check_threshold(&self, t: f64) -> std::result::Result<(), String> {
        match self {
            Metric::Overlap if !(t >= 1.0 && t.is_finite()) => {
                Err(format!("overlap join threshold must be at least 1, got {t}"))
            }
            Metric::Overlap => Ok(()),
            _ if !(t > 0.0 && t <= 1.0) => {
                Err(format!("{} join threshold must be in (0, 1], got {t}", self.name()))
            }
            _ => Ok(()),
        }
    }
}

/// `metric(x, y) >= value` (or `> value` when `strict`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Threshold {
    pub metric: Metric,
    pub value: f64,
    pub strict: bool,
}

impl Threshold {
    pub fn new(metric: Metric, value: f64) -> Self {
        Self { metric, value, strict: false }
    }

    pub fn strict(metric: Metric, value: f64) -> Self {
        Self { metric, value, strict: true }
    }

    /// The join predicate on (overlap, |x|, |y|).
    #[inline]
    pub fn passes(&self, o: u32, a: u32, b: u32) -> bool {
        let v = self.metric.value(o as u64, a as u64, b as u64);
        if self.strict {
            v > self.value
        } else {
            v >= self.value
        }
    }

    /// Smallest overlap with which sets of sizes `a` and `b` pass, or None.
    pub fn min_overlap(&self, a: u32, b: u32) -> Option<u32> {
        let m = a.min(b);
        if m == 0 || !self.passes(m, a, b) {
            return None;
        }
        let t = self.value;
        let (af, bf) = (a as f64, b as f64);
        let est = match self.metric {
            Metric::Jaccard => t * (af + bf) / (1.0 + t),
            Metric::Dice => t * (af + bf) / 2.0,
            Metric::Cosine => t * (af * bf).sqrt(),
            Metric::Overlap => t,
        };
        let mut o = if est.is_finite() { (est.ceil().max(1.0)).min(m as f64) as u32 } else { m };
        while o > 1 && self.passes(o - 1, a, b) {
            o -= 1;
        }
        while !self.passes(o, a, b) {
            o += 1;
        }
        Some(o)
    }

    /// Can some pair of sets of sizes `a` and `b` pass at all?
    #[inline]
    fn feasible(&self, a: u32, b: u32) -> bool {
        b >= 1 && a >= 1 && self.passes(a.min(b), a, b)
    }

    /// The partner sizes `[lo, hi]` (hi capped at `cap`) for which a set of
    /// size `a` can pass (the length filter), or None.
    pub fn size_range(&self, a: u32, cap: u32) -> Option<(u32, u32)> {
        if a == 0 || !self.feasible(a, a) {
            return None;
        }
        let t = self.value;
        let af = a as f64;
        let est_lo = match self.metric {
            Metric::Jaccard => t * af,
            Metric::Dice => t * af / (2.0 - t),
            Metric::Cosine => t * t * af,
            Metric::Overlap => t,
        };
        let mut lo = if est_lo.is_finite() { est_lo.floor().clamp(1.0, af) as u32 } else { 1 };
        while lo > 1 && self.feasible(a, lo - 1) {
            lo -= 1;
        }
        while !self.feasible(a, lo) {
            lo += 1;
        }
        let cap = cap.max(a);
        let est_hi = match self.metric {
            Metric::Jaccard => af / t,
            Metric::Dice => af * (2.0 - t) / t,
            Metric::Cosine => af / (t * t),
            Metric::Overlap => f64::INFINITY,
        };
        let mut hi = if est_hi.is_finite() && est_hi < cap as f64 { (est_hi.ceil() as u32).max(a) } else { cap };
        while hi < cap && self.feasible(a, hi + 1) {
            hi += 1;
        }
        while hi > a && !self.feasible(a, hi) {
            hi -= 1;
        }
        Some((lo, hi))
    }
}

// ---------------------------------------------------------------------------
// Preprocessing (src/algo/ssjoin_prep.rs: the CPU twin and the device path)
// ---------------------------------------------------------------------------

pub use super::ssjoin_prep::{dedup_sets, preprocess};

/// Raw sets as CSR: set `i` is `elems[offsets[i]..offsets[i + 1]]` (any order,
/// duplicates allowed). Set `i` gets id `i`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawSets {
    pub offsets: Vec<usize>,
    pub elems: Vec<u64>,
}

impl RawSets {
    pub fn new() -> Self {
        Self { offsets: vec![0], elems: Vec::new() }
    }

    pub fn from_vecs(sets: &[Vec<u64>]) -> Self {
        let mut r = Self::new();
        for s in sets {
            r.push(s.iter().copied());
        }
        r
    }

    pub fn push(&mut self, set: impl IntoIterator<Item = u64>) {
        if self.offsets.is_empty() {
            self.offsets.push(0);
        }
        self.elems.extend(set);
        self.offsets.push(self.elems.len());
    }

    pub fn len(&self) -> usize {
        self.offsets.len().saturating_sub(1)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn set(&self, i: usize) -> &[u64] {
        &self.elems[self.offsets[i]..self.offsets[i + 1]]
    }
}

/// Preprocessed sets: set at position `p` is `tokens[offsets[p]..offsets[p+1]]`
/// (strictly increasing token ids), positions ordered by size; `ids[p]` is the
/// caller's id of that set. Built by [`preprocess`] (or `Default`, empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetCollection {
    pub offsets: Vec<u32>,
    pub tokens: Vec<u32>,
    pub ids: Vec<u32>,
    /// One past the largest token id of this collection and its partner:
    /// [`preprocess`]'s count of distinct elements (tokens are their ranks).
    /// Kept so the plan does not look up every set's last token (a cache
    /// miss per set, about 0.3 ms for 100k sets, on the GPU path's critical
    /// path). Private, so every collection comes from `preprocess`.
    vocab: u32,
}

impl SetCollection {
    pub fn len(&self) -> usize {
        self.ids.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
    #[inline]
    pub fn set(&self, p: usize) -> &[u32] {
        &self.tokens[self.offsets[p] as usize..self.offsets[p + 1] as usize]
    }
    #[inline]
    pub fn size(&self, p: usize) -> u32 {
        self.offsets[p + 1] - self.offsets[p]
    }
    pub fn max_size(&self) -> u32 {
        self.offsets.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
    }
    /// One past the largest token id.
    pub fn vocabulary(&self) -> u32 {
        self.tokens.iter().max().map(|m| m + 1).unwrap_or(0)
    }
    /// A collection from the preprocessing (`vocab`: the distinct elements of
    /// this collection and its partner).
    pub(super) fn from_parts(offsets: Vec<u32>, tokens: Vec<u32>, ids: Vec<u32>, vocab: u32) -> Self {
        Self { offsets, tokens, ids, vocab }
    }
}

// ---------------------------------------------------------------------------
// Plan shared by both backends: length-filter tables and the prefix index
// ---------------------------------------------------------------------------

/// Per probe size `a`: the window of indexed positions `[lo_pos, hi_pos)`
/// (length filter), the probe prefix length and the partner size range.
struct Tables {
    lo_pos: Vec<u32>,
    hi_pos: Vec<u32>,
    probe_prefix: Vec<u32>,
    lo_size: Vec<u32>,
    hi_size: Vec<u32>,
}

/// Inverted index over the indexed side's prefixes: token -> (set position,
/// token position in the set), sorted by set position (= by set size).
/// `positions` is only filled for the CPU backend (the GPU kernel finds a
/// match's position itself), empty otherwise.
struct PrefixIndex {
    offsets: Vec<u32>,
    sets: Vec<u32>,
    positions: Vec<u32>,
}

/// Work (index entries plus indexed sets, see [`PrefixIndex::set_ranges`])
/// per task below which another task does not pay for itself: a task costs
/// two hand-offs to a pool thread, microseconds, while its share of the two
/// passes costs a few nanoseconds per unit. The
/// GPU path builds the index while a second thread uploads the collection,
/// so the build has to stay well below that upload (about 2 ms for 100k
/// sets); ZIPF-100k at Jaccard 0.6 (0.73M entries, 100k sets): 8 threads.
/// (The former build used 16 threads there, one per 32k entries, with three
/// barriers and 16 vocabulary-sized histograms, and took 3.6 ms on the
/// 16-core host.)
const INDEX_WORK_PER_THREAD: usize = 96 * 1024;
/// log2 of the most token buckets of the first pass: few enough that each
/// thread's write streams (one per bucket) stay in its L1/L2, enough that one
/// bucket's entries and token counters stay small in the second pass.
const INDEX_BUCKET_BITS: u32 = 9;

/// A first-pass entry: the token's offset within its bucket and the set
/// position. u32 (`offset << set_bits | set`) where both fit, which halves
/// the first pass's memory traffic; u64 otherwise.
trait IndexEntry: Copy + Default + Send + Sync {
    fn pack(offset: u32, set: u32, set_bits: u32) -> Self;
    fn offset(self, set_bits: u32) -> usize;
    fn set(self, set_bits: u32) -> u32;
}

impl IndexEntry for u32 {
    #[inline]
    fn pack(offset: u32, set: u32, set_bits: u32) -> Self {
        offset << set_bits | set
    }
    #[inline]
    fn offset(self, set_bits: u32) -> usize {
        (self >> set_bits) as usize
    }
    #[inline]
    fn set(self, set_bits: u32) -> u32 {
        self & ((1u32 << set_bits) - 1)
    }
}

impl IndexEntry for u64 {
    #[inline]
    fn pack(offset: u32, set: u32, _: u32) -> Self {
        (offset as u64) << 32 | set as u64
    }
    #[inline]
    fn offset(self, _: u32) -> usize {
        (self >> 32) as usize
    }
    #[inline]
    fn set(self, _: u32) -> u32 {
        self as u32
    }
}

/// Shape of one index build: tokens `0..vocab` in `buckets` buckets of
/// `1 << shift` tokens; set positions take `set_bits` bits; `total` entries.
#[derive(Clone, Copy)]
struct IndexShape {
    vocab: usize,
    shift: u32,
    buckets: usize,
    set_bits: u32,
    total: usize,
    with_positions: bool,
}

impl IndexShape {
    fn new(n_sets: usize, vocab: usize, total: usize, with_positions: bool) -> Self {
        let bits = |n: usize| usize::BITS - n.saturating_sub(1).leading_zeros();
        let shift = bits(vocab).saturating_sub(INDEX_BUCKET_BITS);
        IndexShape { vocab, shift, buckets: vocab.div_ceil(1 << shift), set_bits: bits(n_sets), total, with_positions }
    }
    /// Whether u32 entries hold a bucket offset and a set position.
    fn packs_u32(&self) -> bool {
        self.set_bits < 32 && self.shift + self.set_bits <= 32
    }
    /// Tokens of buckets `b0..b1`.
    fn tokens(&self, b0: usize, b1: usize) -> std::ops::Range<usize> {
        (b0 << self.shift).min(self.vocab)..(b1 << self.shift).min(self.vocab)
    }
}

/// One thread's first-pass output: its sets' prefix entries grouped by token
/// bucket, ascending set positions within a bucket; bucket `b` is
/// `entries[start[b]..start[b + 1]]`; `positions` parallel to `entries`
/// (token positions in their sets) or empty.
struct IndexPart<E> {
    start: Vec<u32>,
    entries: Vec<E>,
    positions: Vec<u32>,
}

/// One thread's second-pass work: buckets `buckets` and the index slices
/// they fill (their tokens' list starts, their entries).
struct GatherJob<'a> {
    buckets: std::ops::Range<usize>,
    offsets: &'a mut [u32],
    sets: &'a mut [u32],
    positions: &'a mut [u32],
}

impl PrefixIndex {
    /// CSR index of `s`'s prefixes (`prefix[size]` tokens of each set) over
    /// tokens `0..vocab`, on up to `threads` threads (one per `per_thread`
    /// units of work), as a two-pass radix partition (a CSR transpose):
    /// 1. each thread takes a contiguous range of sets and writes their
    ///    entries grouped by token bucket (high token bits) into its own
    ///    array ([`Self::partition`]);
    /// 2. each thread takes a contiguous range of buckets, whose lists form a
    ///    contiguous slice of the index, counting-sorts each bucket's entries
    ///    (from every thread's array, in thread order) by token in a small
    ///    buffer and copies it out ([`Self::gather`]).
    /// Both passes write sequentially or within a small, cache-resident
    /// window. The former build scattered every entry straight to its final
    /// slot (a cache miss per entry over the whole index, most of its time),
    /// kept a vocabulary-sized histogram per thread and synchronised all its
    /// threads with three barriers (on the GPU path the upload runs its own
    /// copy threads meanwhile, so one descheduled thread stalls every other).
    /// Sets are read in order, thread ranges follow set order and both sorts
    /// are stable, so every list stays sorted by set position (what the
    /// window binary searches need) with no sort, exactly as a serial build.
    /// Both passes run as tasks on the host copy pool
    /// ([`crate::gpu::for_each_mut`]); this thread lays out the index between
    /// them (no barriers). `vocab` must exceed every prefix token.
    fn build(s: &SetCollection, prefix: &[u32], vocab: usize, with_positions: bool, threads: usize, per_thread: usize) -> Self {
        let (bounds, total) = Self::set_ranges(s, prefix, threads, per_thread);
        let shape = IndexShape::new(s.len(), vocab, total, with_positions);
        if shape.packs_u32() {
            Self::build_with::<u32>(s, prefix, &bounds, shape)
        } else {
            Self::build_with::<u64>(s, prefix, &bounds, shape)
        }
    }

    fn build_with<E: IndexEntry>(s: &SetCollection, prefix: &[u32], bounds: &[usize], shape: IndexShape) -> Self {
        let (vocab, total) = (shape.vocab, shape.total);
        let threads = bounds.len() - 1;
        let mut offsets = vec![0u32; vocab + 1];
        let mut sets = vec![0u32; total];
        let mut positions = vec![0u32; if shape.with_positions { total } else { 0 }];
        offsets[vocab] = total as u32;
        let part = |i: usize| Self::partition::<E>(s, prefix, &shape, bounds[i]..bounds[i + 1]);
        let (off, out, pos) = (&mut offsets[..vocab], &mut sets[..], &mut positions[..]);
        if threads == 1 {
            let parts = [part(0)];
            for job in Self::jobs(&parts, &shape, 1, off, out, pos) {
                Self::gather(&parts, &shape, job);
            }
        } else {
            // Both passes on the host copy pool (a fresh thread scope costs
            // ~0.5 ms on the GPU machine, a quarter of this whole plan).
            let mut parts: Vec<Option<IndexPart<E>>> = (0..threads).map(|_| None).collect();
            crate::gpu::for_each_mut(&mut parts, &|i, slot| *slot = Some(part(i)));
            let parts: Vec<IndexPart<E>> = parts.into_iter().map(|p| p.expect("for_each_mut runs every part")).collect();
            let mut jobs: Vec<Option<GatherJob>> = Self::jobs(&parts, &shape, threads, off, out, pos).into_iter().map(Some).collect();
            crate::gpu::for_each_mut(&mut jobs, &|_, job| {
                if let Some(job) = job.take() {
                    Self::gather(&parts, &shape, job);
                }
            });
        }
        PrefixIndex { offsets, sets, positions }
    }

    /// Entry count and up to `threads` contiguous set ranges (`bounds`, one
    /// more than the threads) with about equal work, from one pass over the
    /// set sizes in blocks. Work counts a set like an entry: the first pass
    /// reads every set's bounds, prefix length and first tokens twice, which
    /// is most of the time when prefixes are short (high thresholds).
    /// `per_thread`: work below which another thread does not pay for itself.
    fn set_ranges(s: &SetCollection, prefix: &[u32], threads: usize, per_thread: usize) -> (Vec<usize>, usize) {
        let n_s = s.len();
        // Block sums: enough blocks for a fine split, few enough to keep this
        // pass a plain sum over the offsets.
        let block = (n_s / 256).clamp(1, 1024);
        let entries: Vec<usize> = (0..n_s)
            .step_by(block)
            .map(|p0| {
                let p1 = (p0 + block).min(n_s);
                s.offsets[p0..=p1].windows(2).map(|w| prefix[(w[1] - w[0]) as usize] as usize).sum()
            })
            .collect();
        let total: usize = entries.iter().sum();
        let work = total + n_s;
        let threads = if total == 0 { 1 } else { threads.min(work / per_thread.max(1)).max(1) };
        let mut bounds = Vec::with_capacity(threads + 1);
        bounds.push(0usize);
        let mut acc = 0usize;
        for (k, &c) in entries.iter().enumerate() {
            while bounds.len() < threads && acc >= work * bounds.len() / threads {
                bounds.push(k * block);
            }
            acc += c + block.min(n_s - k * block);
        }
        while bounds.len() <= threads {
            bounds.push(n_s);
        }
        (bounds, total)
    }

    /// First pass over the sets `range`.
    fn partition<E: IndexEntry>(
        s: &SetCollection,
        prefix: &[u32],
        shape: &IndexShape,
        range: std::ops::Range<usize>,
    ) -> IndexPart<E> {
        let (shift, set_bits, buckets) = (shape.shift, shape.set_bits, shape.buckets);
        let prefixes = || range.clone().map(|p| &s.set(p)[..prefix[s.size(p) as usize] as usize]);
        let mut start = vec![0u32; buckets + 1];
        for set in prefixes() {
            for &t in set {
                // Panics on a token past the vocabulary's buckets (the second
                // pass catches one inside the last bucket).
                start[(t >> shift) as usize + 1] += 1;
            }
        }
        for b in 0..buckets {
            start[b + 1] += start[b];
        }
        let n = start[buckets] as usize;
        let mut cursor = start[..buckets].to_vec();
        let mut entries = vec![E::default(); n];
        let mut positions = vec![0u32; if shape.with_positions { n } else { 0 }];
        let low = (1u32 << shift) - 1;
        for (p, set) in range.clone().zip(prefixes()) {
            for (j, &t) in set.iter().enumerate() {
                let c = &mut cursor[(t >> shift) as usize];
                entries[*c as usize] = E::pack(t & low, p as u32, set_bits);
                if shape.with_positions {
                    positions[*c as usize] = j as u32;
                }
                *c += 1;
            }
        }
        IndexPart { start, entries, positions }
    }

    /// Splits the index arrays (`offsets` without its last slot) into one
    /// job per thread: contiguous bucket ranges with about equal entries.
    fn jobs<'a, E>(
        parts: &[IndexPart<E>],
        shape: &IndexShape,
        threads: usize,
        mut offsets: &'a mut [u32],
        mut sets: &'a mut [u32],
        mut positions: &'a mut [u32],
    ) -> Vec<GatherJob<'a>> {
        let (buckets, total) = (shape.buckets, shape.total);
        // first[b]: index slot of bucket b's first entry.
        let mut first = Vec::with_capacity(buckets + 1);
        let mut acc = 0usize;
        for b in 0..buckets {
            first.push(acc);
            acc += parts.iter().map(|q| (q.start[b + 1] - q.start[b]) as usize).sum::<usize>();
        }
        first.push(acc);
        assert_eq!(acc, total, "prefix index: entry count");
        let mut jobs = Vec::with_capacity(threads);
        let mut b0 = 0;
        for j in 1..=threads {
            let b1 = if j == threads { buckets } else { first.partition_point(|&f| f < total * j / threads).max(b0) };
            let n = first[b1] - first[b0];
            let (o, o_rest) = std::mem::take(&mut offsets).split_at_mut(shape.tokens(b0, b1).len());
            let (e, e_rest) = std::mem::take(&mut sets).split_at_mut(n);
            let (q, q_rest) = std::mem::take(&mut positions).split_at_mut(if shape.with_positions { n } else { 0 });
            (offsets, sets, positions) = (o_rest, e_rest, q_rest);
            jobs.push(GatherJob { buckets: b0..b1, offsets: o, sets: e, positions: q });
            b0 = b1;
        }
        jobs
    }

    /// Second pass over one job's buckets.
    fn gather<E: IndexEntry>(parts: &[IndexPart<E>], shape: &IndexShape, job: GatherJob) {
        let (shift, set_bits, with_positions) = (shape.shift, shape.set_bits, shape.with_positions);
        let GatherJob { buckets, offsets, sets, positions } = job;
        // Global slot of this job's first entry.
        let base: usize = parts.iter().map(|q| q.start[buckets.start] as usize).sum();
        let t_base = shape.tokens(buckets.start, buckets.start).start;
        let mut cursor = vec![0u32; (1usize << shift).min(shape.vocab)];
        // One bucket's sorted entries: scattered here (small, cache resident),
        // then copied out in order, so the index (fresh memory) is written
        // sequentially instead of line by line at random.
        let (mut sorted, mut sorted_pos) = (Vec::new(), Vec::new());
        let mut at = 0usize;
        for b in buckets {
            let tokens = shape.tokens(b, b + 1);
            let cursor = &mut cursor[..tokens.len()];
            cursor.fill(0);
            let regions = || parts.iter().map(move |q| (q, q.start[b] as usize..q.start[b + 1] as usize));
            for (q, r) in regions() {
                for &e in &q.entries[r] {
                    // Panics on a token past the vocabulary.
                    cursor[e.offset(set_bits)] += 1;
                }
            }
            // Exclusive scan: list starts (global slots), then write cursors
            // within the bucket.
            let mut n = 0u32;
            for (t, c) in tokens.clone().zip(cursor.iter_mut()) {
                offsets[t - t_base] = (base + at) as u32 + n;
                let k = *c;
                *c = n;
                n += k;
            }
            let n = n as usize;
            sorted.resize(n, 0u32);
            sorted_pos.resize(if with_positions { n } else { 0 }, 0u32);
            for (q, r) in regions() {
                let from = r.start;
                for (i, &e) in q.entries[r].iter().enumerate() {
                    let c = &mut cursor[e.offset(set_bits)];
                    sorted[*c as usize] = e.set(set_bits);
                    if with_positions {
                        sorted_pos[*c as usize] = q.positions[from + i];
                    }
                    *c += 1;
                }
            }
            sets[at..at + n].copy_from_slice(&sorted);
            if with_positions {
                positions[at..at + n].copy_from_slice(&sorted_pos);
            }
            at += n;
        }
    }
}

struct Plan<'a> {
    r: &'a SetCollection,
    s: &'a SetCollection,
    self_join: bool,
    tables: Tables,
    index: PrefixIndex,
    s_sizes: Vec<u32>,
}

/// What the prefix index build needs besides the sets, with the tables.
struct Layout {
    tables: Tables,
    s_sizes: Vec<u32>,
    /// Index prefix length per indexed set size.
    index_prefix: Vec<u32>,
    /// One past the largest token of either side.
    vocab: usize,
}

impl<'a> Plan<'a> {
    /// Length tables and prefix index; `with_positions`: record each index
    /// entry's token position (the CPU backend's positional filter).
    fn new(r: &'a SetCollection, s: Option<&'a SetCollection>, thr: Threshold, with_positions: bool, threads: usize) -> Self {
        let Layout { tables, s_sizes, index_prefix, vocab } = Self::layout(r, s, thr);
        let self_join = s.is_none();
        let s = s.unwrap_or(r);
        let index = PrefixIndex::build(s, &index_prefix, vocab, with_positions, threads, INDEX_WORK_PER_THREAD);
        Plan { r, s, self_join, tables, index, s_sizes }
    }

    /// Length tables, index prefix lengths and vocabulary (serial, O(sets)).
    fn layout(r: &SetCollection, s: Option<&SetCollection>, thr: Threshold) -> Layout {
        let self_join = s.is_none();
        let s = s.unwrap_or(r);
        // Slice windows instead of per-set `size()` calls: these O(sets)
        // passes run before the index build on the GPU path's critical path.
        let sizes = |c: &SetCollection| -> Vec<u32> { c.offsets.windows(2).map(|w| w[1] - w[0]).collect() };
        let s_sizes = sizes(s);
        let max_s = s_sizes.iter().copied().max().unwrap_or(0);
        let max_r = if self_join { max_s } else { r.max_size() };
        let n = max_r as usize + 1;
        let mut tables = Tables {
            lo_pos: vec![0; n],
            hi_pos: vec![0; n],
            probe_prefix: vec![0; n],
            lo_size: vec![0; n],
            hi_size: vec![0; n],
        };
        for a in 1..=max_r {
            let Some((lo, hi)) = thr.size_range(a, max_s) else { continue };
            let alpha = thr.min_overlap(a, lo).unwrap_or(a);
            let i = a as usize;
            tables.lo_pos[i] = s_sizes.partition_point(|&b| b < lo) as u32;
            tables.hi_pos[i] = s_sizes.partition_point(|&b| b <= hi) as u32;
            tables.probe_prefix[i] = a - alpha + 1;
            tables.lo_size[i] = lo;
            tables.hi_size[i] = hi;
        }
        // Index prefix per indexed size b.
        let mut index_prefix = vec![0u32; max_s as usize + 1];
        for b in 1..=max_s {
            let alpha = if self_join {
                // Partners probe later, so they are at least as large.
                thr.min_overlap(b, b)
            } else {
                thr.size_range(b, max_r.max(1)).and_then(|(lo, _)| thr.min_overlap(b, lo))
            };
            index_prefix[b as usize] = alpha.map(|al| b - al + 1).unwrap_or(0);
        }
        // One past the largest token of either side (probe tokens look up
        // their lists too), recorded by `preprocess`.
        let vocab = r.vocab.max(s.vocab) as usize;
        Layout { tables, s_sizes, index_prefix, vocab }
    }

    /// The indexed-position window of probe `x` (length filter; self joins
    /// only pair a set with those before it).
    #[inline]
    fn window(&self, x: usize) -> (u32, u32) {
        let a = self.r.size(x) as usize;
        let (lo, mut hi) = (self.tables.lo_pos[a], self.tables.hi_pos[a]);
        if self.self_join {
            hi = hi.min(x as u32);
        }
        (lo, hi.max(lo))
    }

    fn pair(&self, x: u32, y: u32, o: u32) -> Pair {
        let (a, b) = (self.r.ids[x as usize], self.s.ids[y as usize]);
        if self.self_join && b < a {
            (b, a, o)
        } else {
            (a, b, o)
        }
    }
}

/// Overlap of two strictly increasing token lists, or None as soon as it
/// cannot reach `need`.
#[inline]
fn overlap_at_least(x: &[u32], y: &[u32], need: u32) -> Option<u32> {
    let (mut i, mut j, mut o) = (0usize, 0usize, 0u32);
    while i < x.len() && j < y.len() {
        if o as usize + (x.len() - i).min(y.len() - j) < need as usize {
            return None;
        }
        match x[i].cmp(&y[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                o += 1;
                i += 1;
                j += 1;
            }
        }
    }
    (o >= need).then_some(o)
}

/// Counters of one join run (EXPLAIN ANALYZE).
#[derive(Debug, Default, Clone)]
pub struct JoinStats {
    /// Candidate pairs that reached verification.
    pub candidates: u64,
    /// Pairs that passed the threshold.
    pub results: u64,
    /// Probe blocks (GPU) or probe chunks (CPU).
    pub blocks: u64,
    /// Inverted-index entries the probes visited (GPU).
    pub hits: u64,
    /// Host time building the length tables and the prefix index.
    pub plan: std::time::Duration,
    pub transfer: TransferStats,
}

/// Run `work(chunk_start, chunk_end, state)` over `[0, n)` in chunks on
/// `threads` threads; returns the per-thread outputs.
fn parallel_chunks<S: Send, F>(n: usize, threads: usize, chunk: usize, init: impl Fn() -> S + Sync, work: F) -> Vec<S>
where
    F: Fn(usize, usize, &mut S) + Sync,
{
    let next = AtomicUsize::new(0);
    let threads = threads.clamp(1, n.div_ceil(chunk).max(1));
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
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

/// Default thread count: the machine's available parallelism.
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

// ---------------------------------------------------------------------------
// CPU backend
// ---------------------------------------------------------------------------

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
    ssjoin_cpu_until(r, s, thr, threads, stats, None).unwrap_or_default()
}

/// [`ssjoin_cpu_with`] that gives up (None) once `deadline` has passed; the
/// workers check it between chunks of 64 probes (the benchmark's CPU cap).
pub fn ssjoin_cpu_until(
    r: &SetCollection,
    s: Option<&SetCollection>,
    thr: Threshold,
    threads: usize,
    stats: &mut JoinStats,
    deadline: Option<Instant>,
) -> Option<Vec<Pair>> {
    let expired = std::sync::atomic::AtomicBool::new(false);
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
        |start, end, st| {
            if let Some(d) = deadline {
                if expired.load(Ordering::Relaxed) || Instant::now() >= d {
                    expired.store(true, Ordering::Relaxed);
                    return;
                }
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
                    let (ls, le) = (plan.index.offsets[w as usize] as usize, plan.index.offsets[w as usize + 1] as usize);
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

// ---------------------------------------------------------------------------
// References (tests and benchmarks)
// ---------------------------------------------------------------------------

/// Nested-loop reference: every pair, full merge, the same predicate.
pub fn ssjoin_brute_force(r: &SetCollection, s: Option<&SetCollection>, thr: Threshold) -> Vec<Pair> {
    let self_join = s.is_none();
    let s = s.unwrap_or(r);
    let mut out = Vec::new();
    for x in 0..r.len() {
        let ys = if self_join { 0..x } else { 0..s.len() };
        for y in ys {
            let o = overlap_at_least(r.set(x), s.set(y), 0).unwrap_or(0);
            if thr.passes(o, r.size(x), s.size(y)) {
                let (a, b) = (r.ids[x], s.ids[y]);
                out.push(if self_join && b < a { (b, a, o) } else { (a, b, o) });
            }
        }
    }
    out
}

/// Exact reference without any filter: a full inverted index over `s` counts
/// every intersecting pair, then the predicate decides (thresholds > 0 need
/// overlap >= 1). Multithreaded; fast enough for tens of thousands of sets.
pub fn ssjoin_exact_counter(r: &SetCollection, s: Option<&SetCollection>, thr: Threshold) -> Vec<Pair> {
    let self_join = s.is_none();
    let s = s.unwrap_or(r);
    let vocab = r.vocabulary().max(s.vocabulary()) as usize;
    let mut offsets = vec![0u32; vocab + 1];
    for &t in &s.tokens {
        offsets[t as usize + 1] += 1;
    }
    for i in 1..offsets.len() {
        offsets[i] += offsets[i - 1];
    }
    let mut fill = offsets.clone();
    let mut lists = vec![0u32; s.tokens.len()];
    for p in 0..s.len() {
        for &t in s.set(p) {
            lists[fill[t as usize] as usize] = p as u32;
            fill[t as usize] += 1;
        }
    }
    let states = parallel_chunks(
        r.len(),
        default_threads(),
        32,
        || (vec![0u32; s.len()], Vec::<u32>::new(), Vec::<Pair>::new()),
        |start, end, (counts, touched, out)| {
            for x in start..end {
                for &t in r.set(x) {
                    let list = &lists[offsets[t as usize] as usize..offsets[t as usize + 1] as usize];
                    let end = if self_join { list.partition_point(|&y| (y as usize) < x) } else { list.len() };
                    for &y in &list[..end] {
                        if counts[y as usize] == 0 {
                            touched.push(y);
                        }
                        counts[y as usize] += 1;
                    }
                }
                for &y in touched.iter() {
                    let o = std::mem::take(&mut counts[y as usize]);
                    if thr.passes(o, r.size(x), s.size(y as usize)) {
                        let (a, b) = (r.ids[x], s.ids[y as usize]);
                        out.push(if self_join && b < a { (b, a, o) } else { (a, b, o) });
                    }
                }
                touched.clear();
            }
        },
    );
    states.into_iter().flat_map(|(_, _, o)| o).collect()
}

// ---------------------------------------------------------------------------
// GPU backend
// ---------------------------------------------------------------------------

/// Threads per CUDA block of `join_probes` (the kernel's SF_BLOCK).
const JOIN_BLOCK: u32 = 128;
/// Slots of the shared-memory candidate table of the first pass: 16 bytes
/// each (key, count, last position, compaction list) = 32 KiB per CUDA block,
/// under the 48 KiB default, so about six blocks fit an SM. Probes with more
/// distinct candidates run again with tables in global memory.
const SHARED_SLOTS: u32 = 2048;
/// CUDA blocks per SM for the grid-stride loops over probes when the
/// occupancy query fails (normally the grid is what fits at once, so no
/// block starts late with a full share of probes).
const BLOCKS_PER_SM: u32 = 4;
/// Result triples the output buffer starts with (it grows on overflow).
const MAX_OUT_START: usize = 1 << 24;

/// Table slots for a probe with at most `m` distinct candidates (the
/// kernel's `sf_table_slots`): a power of two >= 1.5 m + 1, at least 32.
fn table_slots(m: u32) -> usize {
    let want = m as u64 + (m >> 1) as u64 + 1;
    want.next_power_of_two().clamp(32, 1 << 31) as usize
}

/// The device-resident inputs of one join, in two buffers (the collection,
/// uploaded while the host builds the plan; then the plan's tables and
/// index), passed to the kernel as views.
struct DeviceInputs {
    bufs: [crate::gpu::DeviceBuffer<u32>; 2],
    /// (buffer, range) of r_off, r_tok, s_off, s_tok, pp, lo, hi, idx_off, idx_sets
    ranges: [(usize, std::ops::Range<usize>); 9],
}

/// Kernel arguments fixed for the whole join, and one launch of
/// `join_probes` (the only kernel), so the launch list lives in one place.
struct JoinKernel<'a> {
    gpu: &'a Gpu,
    f: cudarc::driver::CudaFunction,
    inputs: &'a DeviceInputs,
    self_join: i32,
    metric: i32,
    t: f64,
    strict: i32,
    shared_slots: u32,
}

/// Where one launch takes its probes and candidate tables from.
enum Probes<'a> {
    /// Probe positions `first..first + n`, shared-memory tables; probes
    /// whose table would exceed [`SHARED_SLOTS`] are deferred to `big`.
    Range { first: u32, n: u32 },
    /// Probe positions `list[first..first + n]`, global tables at
    /// `tab + tab_off[first + i]` (4 * slots words each).
    Listed { list: &'a crate::gpu::DeviceBuffer<u32>, tab: &'a crate::gpu::DeviceBuffer<u32>, tab_off: &'a crate::gpu::DeviceBuffer<u64>, first: u32, n: u32 },
}

impl JoinKernel<'_> {
    fn launch(
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
struct GpuTuning {
    /// Shared-memory table slots per CUDA block in the first pass.
    shared_slots: u32,
    /// Initial output buffer (triples); None: from the budget.
    out_start: Option<usize>,
}

const DEFAULT_TUNING: GpuTuning = GpuTuning { shared_slots: SHARED_SLOTS, out_start: None };

/// Device counters: result triples, deferred probes, candidates, index entries.
fn read_counters(gpu: &Gpu, c: &crate::gpu::DeviceBuffer<u64>, ts: &mut TransferStats) -> Result<[u64; 4]> {
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

fn ssjoin_gpu_tuned(
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
        return Err(DataFusionError::ResourcesExhausted("similarity join: more than 2^32 set elements".into()));
    }

    // The collection goes up on a second thread while this one builds the
    // plan (length tables + prefix index), so its staging copy and DMA hide
    // behind the index build instead of following it; the plan's arrays
    // follow in a second, smaller upload.
    let mut collection: Vec<&[u32]> = vec![&r.offsets, &r.tokens];
    if !self_join {
        collection.extend([s_c.offsets.as_slice(), s_c.tokens.as_slice()]);
    }
    let (plan, plan_time, uploaded) = std::thread::scope(|scope| {
        let up = scope.spawn(|| -> Result<(crate::gpu::DeviceBuffer<u32>, TransferStats)> {
            // A fresh thread has no current CUDA context.
            gpu.context().bind_to_thread().map_err(|e| cuda_err("bind CUDA context", e))?;
            let mut st = TransferStats::default();
            let buf = gpu.upload_chunks(&collection, &mut st)?;
            Ok((buf, st))
        });
        let started = Instant::now();
        let plan = Plan::new(r, s, thr, false, default_threads());
        let plan_time = started.elapsed();
        let uploaded =
            up.join().unwrap_or_else(|_| Err(DataFusionError::Internal("ssjoin: collection upload thread panicked".into())));
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

    let plan_arrays: [&[u32]; 5] = [
        &plan.tables.probe_prefix,
        &plan.tables.lo_pos,
        &plan.tables.hi_pos,
        &plan.index.offsets,
        &plan.index.sets,
    ];
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
        f: gpu.function("ssjoin", "join_probes")?,
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
            return Err(DataFusionError::ResourcesExhausted(format!(
                "setfusion GPU: device memory budget exceeded: similarity join probe needs a {} byte candidate table, {} bytes available",
                largest * 4,
                scratch_words * 4
            )));
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
            let probes =
                Probes::Listed { list: &list, tab: &tab, tab_off: &tab_off, first: first as u32, n: (end - first) as u32 };
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
fn drain(
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

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    /// Uniform elements in [0, universe), sizes in [0, max_size].
    pub(crate) fn uniform(n: usize, universe: u64, max_size: usize, seed: u64) -> RawSets {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut r = RawSets::new();
        for _ in 0..n {
            let k = rng.random_range(0..=max_size);
            r.push((0..k).map(|_| rng.random_range(0..universe)).collect::<Vec<_>>());
        }
        r
    }

    /// Zipf-skewed elements (exponent ~1) via inverse CDF on a harmonic table.
    pub(crate) fn zipf(n: usize, universe: usize, max_size: usize, seed: u64) -> RawSets {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut cdf = Vec::with_capacity(universe);
        let mut acc = 0.0;
        for i in 1..=universe {
            acc += 1.0 / i as f64;
            cdf.push(acc);
        }
        let mut r = RawSets::new();
        for _ in 0..n {
            let k = rng.random_range(0..=max_size);
            r.push(
                (0..k)
                    .map(|_| {
                        let u = rng.random::<f64>() * acc;
                        cdf.partition_point(|&c| c < u) as u64 * 7919 + 3
                    })
                    .collect::<Vec<_>>(),
            );
        }
        r
    }

    fn sorted(mut v: Vec<Pair>) -> Vec<Pair> {
        v.sort_unstable();
        v
    }

    fn thresholds() -> Vec<Threshold> {
        let mut v = Vec::new();
        for m in [Metric::Jaccard, Metric::Dice, Metric::Cosine] {
            for t in [0.1, 0.3, 0.5, 0.6, 0.75, 0.9, 1.0] {
                v.push(Threshold::new(m, t));
            }
            v.push(Threshold::strict(m, 0.5));
            v.push(Threshold::strict(m, 1.0));
        }
        for k in [1.0, 2.0, 3.0, 2.5] {
            v.push(Threshold::new(Metric::Overlap, k));
        }
        v.push(Threshold::strict(Metric::Overlap, 2.0));
        v
    }

    fn collections() -> Vec<(&'static str, RawSets, RawSets)> {
        vec![
            ("uniform", uniform(300, 40, 12, 1), uniform(250, 40, 12, 2)),
            ("zipf", zipf(300, 200, 20, 3), zipf(200, 200, 20, 4)),
            ("dups", uniform(200, 8, 10, 5), uniform(100, 8, 6, 6)),
        ]
    }

    #[test]
    fn min_overlap_and_size_range_agree_with_predicate() {
        for thr in thresholds() {
            for a in 0..40u32 {
                for b in 0..40u32 {
                    let expect = (1..=a.min(b)).find(|&o| thr.passes(o, a, b));
                    assert_eq!(thr.min_overlap(a, b), expect, "{thr:?} a={a} b={b}");
                }
                let feasible: Vec<u32> = (1..=60).filter(|&b| a > 0 && thr.passes(a.min(b), a, b)).collect();
                let range = thr.size_range(a, 60);
                match range {
                    None => assert!(feasible.is_empty(), "{thr:?} a={a}"),
                    Some((lo, hi)) => assert_eq!(feasible, (lo..=hi).collect::<Vec<_>>(), "{thr:?} a={a}"),
                }
            }
        }
    }

    #[test]
    fn preprocess_orders_tokens_and_sets() {
        let raw = RawSets::from_vecs(&[vec![5, 5, 1, 9], vec![], vec![1], vec![1, 9, 2]]);
        let (c, _) = preprocess(&raw, None);
        // 1 appears in 3 sets, 9 in 2, 5 and 2 in one: 2 and 5 get the smallest ids.
        assert_eq!(c.ids, vec![1, 2, 0, 3]);
        assert_eq!(c.size(0), 0);
        for p in 0..c.len() {
            assert!(c.set(p).windows(2).all(|w| w[0] < w[1]));
        }
        let id_of_1 = c.set(1)[0];
        assert_eq!(id_of_1, 3, "most frequent token gets the largest id");
        // The recorded vocabulary (the plan's offsets length) is one past
        // the largest token, of both sides for a pair.
        assert_eq!(c.vocab, c.vocabulary());
        for (_, a, b) in collections() {
            let (r, s) = preprocess(&a, Some(&b));
            let s = s.unwrap();
            assert_eq!((r.vocab, s.vocab), (r.vocabulary().max(s.vocabulary()), r.vocab));
            let (r, _) = preprocess(&a, None);
            assert_eq!(r.vocab, r.vocabulary());
        }
    }

    #[test]
    fn cpu_matches_brute_force() {
        for (name, a, b) in collections() {
            let (r, s) = preprocess(&a, Some(&b));
            let s = s.unwrap();
            let (rs, _) = preprocess(&a, None);
            for thr in thresholds() {
                let want = sorted(ssjoin_brute_force(&rs, None, thr));
                assert_eq!(sorted(ssjoin_cpu(&rs, None, thr)), want, "{name} self {thr:?}");
                assert_eq!(sorted(ssjoin_exact_counter(&rs, None, thr)), want, "{name} self counter {thr:?}");
                let want = sorted(ssjoin_brute_force(&r, Some(&s), thr));
                assert_eq!(sorted(ssjoin_cpu(&r, Some(&s), thr)), want, "{name} r-s {thr:?}");
                assert_eq!(sorted(ssjoin_cpu_with(&r, Some(&s), thr, 3, &mut JoinStats::default())), want);
            }
        }
    }

    /// Reference prefix index: one list per token, sets appended in order.
    fn naive_index(c: &SetCollection, prefix: &[u32], vocab: usize) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
        let mut lists = vec![Vec::new(); vocab];
        for p in 0..c.len() {
            let set = c.set(p);
            for (j, &t) in set[..prefix[set.len()] as usize].iter().enumerate() {
                lists[t as usize].push((p as u32, j as u32));
            }
        }
        let mut offsets = vec![0u32];
        for l in &lists {
            offsets.push(offsets.last().unwrap() + l.len() as u32);
        }
        let flat = lists.iter().flatten();
        (offsets, flat.clone().map(|e| e.0).collect(), flat.map(|e| e.1).collect())
    }

    /// The index build equals a naive one (same lists, same order) for any
    /// thread count including more threads than sets, with one token per
    /// bucket (small vocabulary) or several, a vocabulary past the largest
    /// token, and both first-pass entry widths.
    #[test]
    fn parallel_prefix_index_matches_serial() {
        let (small, _) = preprocess(&zipf(3000, 500, 30, 21), None);
        let (large, _) = preprocess(&zipf(3000, 20_000, 40, 22), None);
        assert_eq!(IndexShape::new(small.len(), small.vocabulary() as usize, 0, false).shift, 0);
        assert!(IndexShape::new(large.len(), large.vocabulary() as usize, 0, false).shift >= 3);
        for c in [&small, &large] {
            for slack in [0, 37] {
                let vocab = c.vocabulary() as usize + slack;
                for cut in [0u32, 1, 3] {
                    // prefix[b]: all but `cut` tokens of a set of size b.
                    let prefix: Vec<u32> = (0..=c.max_size()).map(|b| b.saturating_sub(cut)).collect();
                    let (offsets, sets, positions) = naive_index(c, &prefix, vocab);
                    let what = format!("vocab {vocab} cut {cut}");
                    for threads in [1, 2, 3, 7, 16, 64] {
                        for pos in [true, false] {
                            let idx = PrefixIndex::build(c, &prefix, vocab, pos, threads, 1);
                            assert_eq!(idx.offsets, offsets, "{what} threads {threads}");
                            assert_eq!(idx.sets, sets, "{what} threads {threads}");
                            if pos {
                                assert_eq!(idx.positions, positions, "{what} threads {threads}");
                            } else {
                                assert!(idx.positions.is_empty());
                            }
                        }
                    }
                    // u64 entries (taken when a bucket offset and a set
                    // position do not fit 32 bits together).
                    let (bounds, total) = PrefixIndex::set_ranges(c, &prefix, 3, 1);
                    let shape = IndexShape::new(c.len(), vocab, total, true);
                    assert!(shape.packs_u32());
                    let wide = PrefixIndex::build_with::<u64>(c, &prefix, &bounds, shape);
                    assert_eq!((&wide.offsets, &wide.sets, &wide.positions), (&offsets, &sets, &positions), "{what} u64");
                }
            }
        }
        // More threads than sets.
        let (few, _) = preprocess(&uniform(5, 30, 12, 8), None);
        let prefix: Vec<u32> = (0..=few.max_size()).collect();
        let v = few.vocabulary() as usize;
        let many = PrefixIndex::build(&few, &prefix, v, true, 16, 1);
        assert_eq!((many.offsets, many.sets, many.positions), naive_index(&few, &prefix, v));
        let (e, _) = preprocess(&RawSets::from_vecs(&[vec![], vec![]]), None);
        let idx = PrefixIndex::build(&e, &[0], 0, true, 4, 1);
        assert_eq!((idx.offsets, idx.sets.len()), (vec![0], 0));
    }

    /// Host plan time on bench-like 100k collections, by phase: UNIFORM-like
    /// (sizes 10..=50, universe 100k) and the bench's own ZIPF-100k, whose
    /// GPU run at Jaccard 0.6 waited on the plan (the collection upload on a
    /// second thread takes about 2 ms there).
    /// `cargo test --release --lib plan_timing -- --ignored --nocapture`;
    /// SSJOIN_PLAN_THREADS=1,2,16 sets the thread counts (default: 1 and all).
    /// Phases, each on this thread: layout (length tables), ranges (entry
    /// count, set ranges), partition and gather (the index build's passes).
    #[test]
    #[ignore]
    fn plan_timing() {
        let mut rng = StdRng::seed_from_u64(5);
        let mut raw = RawSets::new();
        for _ in 0..100_000 {
            let k = rng.random_range(10..=50);
            raw.push((0..k).map(|_| rng.random_range(0..100_000u64)).collect::<Vec<_>>());
        }
        let (uniform_c, _) = preprocess(&raw, None);
        let (zipf_c, _) = preprocess(&crate::bench::ssjoin::generate(100_000, true, 13 + 100_000), None);
        let threads: Vec<usize> = crate::env::ssjoin_plan_threads()
            .unwrap_or_else(|| vec![1, default_threads()]);
        let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
        for (name, c) in [("uniform", &uniform_c), ("zipf", &zipf_c)] {
            eprintln!("{name}: {} sets, {} tokens, vocabulary {}", c.len(), c.tokens.len(), c.vocabulary());
            for t in [0.5, 0.6, 0.9] {
                let thr = Threshold::new(Metric::Jaccard, t);
                let mut runs = vec![(1, true)];
                runs.extend(threads.iter().map(|&n| (n, false)));
                for (threads, pos) in runs {
                    let mut best = std::time::Duration::MAX;
                    let mut phases = [std::time::Duration::MAX; 4];
                    let mut workers = 0;
                    for _ in 0..9 {
                        let t0 = Instant::now();
                        let plan = Plan::new(c, None, thr, pos, threads);
                        best = best.min(t0.elapsed());
                        std::hint::black_box(&plan.index.sets);
                        drop(plan);
                        // The same steps one by one.
                        let t0 = Instant::now();
                        let l = Plan::layout(c, None, thr);
                        let t1 = Instant::now();
                        let (bounds, total) = PrefixIndex::set_ranges(c, &l.index_prefix, threads, INDEX_WORK_PER_THREAD);
                        let t2 = Instant::now();
                        // The two passes on this thread (u32 entries here).
                        let shape = IndexShape::new(c.len(), l.vocab, total, pos);
                        assert!(shape.packs_u32());
                        let parts: Vec<IndexPart<u32>> = bounds
                            .windows(2)
                            .map(|w| PrefixIndex::partition(c, &l.index_prefix, &shape, w[0]..w[1]))
                            .collect();
                        let t3 = Instant::now();
                        let (mut offsets, mut sets, mut positions) =
                            (vec![0u32; l.vocab + 1], vec![0u32; total], vec![0u32; if pos { total } else { 0 }]);
                        let off = &mut offsets[..l.vocab];
                        for job in PrefixIndex::jobs(&parts, &shape, parts.len(), off, &mut sets, &mut positions) {
                            PrefixIndex::gather(&parts, &shape, job);
                        }
                        let t4 = Instant::now();
                        std::hint::black_box(&sets);
                        workers = bounds.len() - 1;
                        for (p, d) in phases.iter_mut().zip([t1 - t0, t2 - t1, t3 - t2, t4 - t3]) {
                            *p = (*p).min(d);
                        }
                    }
                    let entries = Plan::new(c, None, thr, pos, threads).index.sets.len();
                    eprintln!(
                        "{name} t={t} threads={threads} ({workers} used) positions={pos}: plan {:.3} ms ({entries} entries); \
                         layout {:.3} ranges {:.3} partition {:.3} gather {:.3}",
                        ms(best),
                        ms(phases[0]),
                        ms(phases[1]),
                        ms(phases[2]),
                        ms(phases[3])
                    );
                }
            }
        }
    }

    #[test]
    fn empty_inputs() {
        let empty = RawSets::new();
        let some = RawSets::from_vecs(&[vec![1, 2], vec![], vec![2, 1, 1]]);
        let thr = Threshold::new(Metric::Jaccard, 0.5);
        let (e, _) = preprocess(&empty, None);
        assert!(ssjoin_cpu(&e, None, thr).is_empty());
        let (r, s) = preprocess(&empty, Some(&some));
        assert!(ssjoin_cpu(&r, s.as_ref(), thr).is_empty());
        let (r, s) = preprocess(&some, Some(&empty));
        assert!(ssjoin_cpu(&r, s.as_ref(), thr).is_empty());
        let (r, _) = preprocess(&some, None);
        assert_eq!(ssjoin_cpu(&r, None, thr), vec![(0, 2, 2)]);
        // Only empty sets: nothing joins (empty/empty similarity is 0).
        let (r, _) = preprocess(&RawSets::from_vecs(&[vec![], vec![]]), None);
        assert!(ssjoin_cpu(&r, None, Threshold::new(Metric::Jaccard, 0.01)).is_empty());
    }

    /// GPU vs brute force; skips without a device unless SETFUSION_REQUIRE_GPU=1.
    #[test]
    fn gpu_matches_brute_force() {
        let g = match crate::gpu::gpu(0) {
            Ok(g) => g,
            Err(e) => {
                if crate::env::require_gpu() {
                    panic!("SETFUSION_REQUIRE_GPU=1 but no GPU: {e}");
                }
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "skipping gpu_matches_brute_force: {e}");
                return;
            }
        };
        let g = g.lease(0);
        for limit in [0usize, 1 << 20] {
            g.budget().set_limit(limit);
            for (name, a, b) in collections() {
                let (r, s) = preprocess(&a, Some(&b));
                let s = s.unwrap();
                let (rs, _) = preprocess(&a, None);
                for thr in thresholds() {
                    let want = sorted(ssjoin_brute_force(&rs, None, thr));
                    let got = ssjoin_gpu(&g, &rs, None, thr, &mut JoinStats::default()).unwrap();
                    assert_eq!(sorted(got), want, "{name} self {thr:?} limit {limit}");
                    let want = sorted(ssjoin_brute_force(&r, Some(&s), thr));
                    let got = ssjoin_gpu(&g, &r, Some(&s), thr, &mut JoinStats::default()).unwrap();
                    assert_eq!(sorted(got), want, "{name} r-s {thr:?} limit {limit}");
                }
            }
        }
        // Tiny shared tables (nearly every probe deferred to global tables, in
        // many groups) and a one-triple output buffer (overflow: grow, drain).
        g.budget().set_limit(1 << 20);
        for (name, a, b) in collections() {
            let (r, s) = preprocess(&a, Some(&b));
            let (rs, _) = preprocess(&a, None);
            for shared_slots in [32, 64] {
                let tuning = GpuTuning { shared_slots, out_start: Some(1) };
                for thr in thresholds() {
                    let want = sorted(ssjoin_brute_force(&rs, None, thr));
                    let got = ssjoin_gpu_tuned(&g, &rs, None, thr, &mut JoinStats::default(), tuning).unwrap();
                    assert_eq!(sorted(got), want, "{name} self {thr:?} tuned {tuning:?}");
                    let want = sorted(ssjoin_brute_force(&r, s.as_ref(), thr));
                    let got = ssjoin_gpu_tuned(&g, &r, s.as_ref(), thr, &mut JoinStats::default(), tuning).unwrap();
                    assert_eq!(sorted(got), want, "{name} r-s {thr:?} tuned {tuning:?}");
                }
            }
        }
        // Sets longer than one segment chunk (128 prefix tokens), few of them.
        let long = uniform(60, 400, 390, 12);
        let (lr, _) = preprocess(&long, None);
        for t in [0.05, 0.2, 0.5] {
            let thr = Threshold::new(Metric::Jaccard, t);
            let want = sorted(ssjoin_brute_force(&lr, None, thr));
            assert_eq!(sorted(ssjoin_gpu(&g, &lr, None, thr, &mut JoinStats::default()).unwrap()), want, "long t={t}");
            let tuning = GpuTuning { shared_slots: 32, out_start: Some(1) };
            let got = ssjoin_gpu_tuned(&g, &lr, None, thr, &mut JoinStats::default(), tuning).unwrap();
            assert_eq!(sorted(got), want, "long tuned t={t}");
        }
        // A larger skewed self join streamed through many small blocks.
        g.budget().set_limit(4 << 20);
        let (r, _) = preprocess(&zipf(5000, 2000, 40, 9), None);
        for t in [0.3, 0.6, 0.9] {
            let thr = Threshold::new(Metric::Jaccard, t);
            let mut st = JoinStats::default();
            let got = sorted(ssjoin_gpu(&g, &r, None, thr, &mut st).unwrap());
            assert_eq!(got, sorted(ssjoin_exact_counter(&r, None, thr)), "zipf 5000 t={t}");
            assert!(st.blocks >= 1);
        }
        g.budget().set_limit(0);
    }
}

/// Doctor self-check: the GPU join against brute force on random collections,
/// every metric, self and R-S joins.
pub fn self_check(gpu: &Gpu) -> Result<String> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut random_sets = |n: usize| {
        let sets: Vec<Vec<u64>> = (0..n).map(|_| (0..rng.random_range(0..20)).map(|_| rng.random_range(0..60u64)).collect()).collect();
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
