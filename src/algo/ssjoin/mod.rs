//! Set-similarity join (issue 4): all pairs of sets whose Jaccard, Dice,
//! cosine similarity or overlap reaches a threshold.
//!
//! * **Preprocessing** ([`preprocess`](crate::algo::ssjoin_prep::preprocess)
//!   on the host's cores, or on the device for the GPU backend;
//!   src/algo/ssjoin_prep.rs, which imports this module's types): elements (u64 keys:
//!   integers, or dictionary ids of strings) become dense u32 token ids
//!   ordered by ascending global document frequency over both inputs (rare
//!   tokens first, so prefixes are selective); every set is sorted and
//!   deduplicated; sets are ordered by size (ties by id).
//! Files: the types here; [`plan`] (length-filter tables and the prefix index,
//! shared by both backends); [`cpu`]; [`gpu`] (the launcher of
//! kernels/ssjoin.cu); [`reference`] (brute force, for tests and benchmarks);
//! [`encode`] (Arrow list columns to [`RawSets`]).
//!
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
//! same expression as the SQL similarity functions and as the kernel. All
//! filters are derived from that predicate (never from a separately rounded
//! formula), so they only drop pairs the predicate rejects.
//!
//! Similarity of two empty sets is 0 (as in the SQL functions): with a threshold
//! > 0 an empty set never joins.

pub mod cpu;
pub mod encode;
pub mod gpu;
pub mod plan;
pub mod reference;
#[cfg(test)]
mod tests;

pub use cpu::{default_threads, ssjoin_cpu, ssjoin_cpu_until, ssjoin_cpu_with};
pub use gpu::{self_check, ssjoin_gpu};
pub use plan::JoinStats;
pub use reference::{ssjoin_brute_force, ssjoin_exact_counter};

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

    /// The join predicate on (overlap, |x|, |y|). Compared as DataFusion
    /// compares floats ([`crate::util::double_order_key`]): -0.0 equals 0.0,
    /// a NaN with the sign bit is below everything, any other NaN above.
    #[inline]
    pub fn passes(&self, o: u32, a: u32, b: u32) -> bool {
        self.passes_value(self.metric.value(o as u64, a as u64, b as u64))
    }

    #[inline]
    fn passes_value(&self, v: f64) -> bool {
        use crate::util::double_order_key as key;
        let order = key(v.to_bits()).cmp(&key(self.value.to_bits()));
        if self.strict {
            order.is_gt()
        } else {
            order.is_ge()
        }
    }

    /// Does every pair of sets pass, disjoint and empty ones too (the metric's
    /// least value, 0, passes: `jaccard(a, b) >= 0`, `overlap(a, b) > -1`)?
    /// The join lists pairs that share an element, so such a predicate is not
    /// its work. Any other threshold is exact, however high (none passes
    /// `jaccard(a, b) > 1`: an empty answer).
    pub fn every_pair_passes(&self) -> bool {
        self.passes_value(0.0)
    }

    /// `Err` (saying why) where the join cannot answer this predicate.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.every_pair_passes() {
            let op = if self.strict { ">" } else { ">=" };
            return Err(format!(
                "every pair of non-NULL sets passes {}(a, b) {op} {}, disjoint ones too: a nested loop's work, not a similarity join's",
                self.metric.name(),
                self.value
            ));
        }
        Ok(())
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
/// caller's id of that set. Built by
/// [`crate::algo::ssjoin_prep::preprocess`] (or `Default`, empty).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetCollection {
    pub offsets: Vec<u32>,
    pub tokens: Vec<u32>,
    pub ids: Vec<u32>,
    /// One past the largest token id of this collection and its partner:
    /// `preprocess`'s count of distinct elements (tokens are their ranks).
    /// Kept so the plan does not look up every set's last token (a cache
    /// miss per set, about 0.3 ms for 100k sets, on the GPU path's critical
    /// path). Private, so every collection comes from `preprocess`.
    pub(super) vocab: u32,
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
