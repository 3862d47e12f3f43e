//! The plan both backends share: length-filter tables and the prefix index.

use crate::gpu::TransferStats;

use super::*;

/// Per probe size `a`: the window of indexed positions `[lo_pos, hi_pos)`
/// (length filter), the probe prefix length and the partner size range.
pub(super) struct Tables {
    pub(super) lo_pos: Vec<u32>,
    pub(super) hi_pos: Vec<u32>,
    pub(super) probe_prefix: Vec<u32>,
    pub(super) lo_size: Vec<u32>,
    pub(super) hi_size: Vec<u32>,
}

/// Inverted index over the indexed side's prefixes: token -> (set position,
/// token position in the set), sorted by set position (= by set size).
/// `positions` is only filled for the CPU backend (the GPU kernel finds a
/// match's position itself), empty otherwise.
pub(super) struct PrefixIndex {
    pub(super) offsets: Vec<u32>,
    pub(super) sets: Vec<u32>,
    pub(super) positions: Vec<u32>,
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
pub(super) const INDEX_WORK_PER_THREAD: usize = 96 * 1024;
/// log2 of the most token buckets of the first pass: few enough that each
/// thread's write streams (one per bucket) stay in its L1/L2, enough that one
/// bucket's entries and token counters stay small in the second pass.
pub(super) const INDEX_BUCKET_BITS: u32 = 9;

/// A first-pass entry: the token's offset within its bucket and the set
/// position. u32 (`offset << set_bits | set`) where both fit, which halves
/// the first pass's memory traffic; u64 otherwise.
pub(super) trait IndexEntry: Copy + Default + Send + Sync {
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
pub(super) struct IndexShape {
    pub(super) vocab: usize,
    pub(super) shift: u32,
    pub(super) buckets: usize,
    pub(super) set_bits: u32,
    pub(super) total: usize,
    pub(super) with_positions: bool,
}

impl IndexShape {
    pub(super) fn new(n_sets: usize, vocab: usize, total: usize, with_positions: bool) -> Self {
        let bits = |n: usize| usize::BITS - n.saturating_sub(1).leading_zeros();
        let shift = bits(vocab).saturating_sub(INDEX_BUCKET_BITS);
        IndexShape { vocab, shift, buckets: vocab.div_ceil(1 << shift), set_bits: bits(n_sets), total, with_positions }
    }
    /// Whether u32 entries hold a bucket offset and a set position.
    pub(super) fn packs_u32(&self) -> bool {
        self.set_bits < 32 && self.shift + self.set_bits <= 32
    }
    /// Tokens of buckets `b0..b1`.
    pub(super) fn tokens(&self, b0: usize, b1: usize) -> std::ops::Range<usize> {
        (b0 << self.shift).min(self.vocab)..(b1 << self.shift).min(self.vocab)
    }
}

/// One thread's first-pass output: its sets' prefix entries grouped by token
/// bucket, ascending set positions within a bucket; bucket `b` is
/// `entries[start[b]..start[b + 1]]`; `positions` parallel to `entries`
/// (token positions in their sets) or empty.
pub(super) struct IndexPart<E> {
    pub(super) start: Vec<u32>,
    pub(super) entries: Vec<E>,
    pub(super) positions: Vec<u32>,
}

/// One thread's second-pass work: buckets `buckets` and the index slices
/// they fill (their tokens' list starts, their entries).
pub(super) struct GatherJob<'a> {
    pub(super) buckets: std::ops::Range<usize>,
    pub(super) offsets: &'a mut [u32],
    pub(super) sets: &'a mut [u32],
    pub(super) positions: &'a mut [u32],
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
    /// ([`crate::host::for_each_mut`]); this thread lays out the index between
    /// them (no barriers). `vocab` must exceed every prefix token.
    pub(super) fn build(
        s: &SetCollection,
        prefix: &[u32],
        vocab: usize,
        with_positions: bool,
        threads: usize,
        per_thread: usize,
    ) -> Self {
        let (bounds, total) = Self::set_ranges(s, prefix, threads, per_thread);
        let shape = IndexShape::new(s.len(), vocab, total, with_positions);
        if shape.packs_u32() {
            Self::build_with::<u32>(s, prefix, &bounds, shape)
        } else {
            Self::build_with::<u64>(s, prefix, &bounds, shape)
        }
    }

    pub(super) fn build_with<E: IndexEntry>(
        s: &SetCollection,
        prefix: &[u32],
        bounds: &[usize],
        shape: IndexShape,
    ) -> Self {
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
            crate::host::for_each_mut(&mut parts, &|i, slot| *slot = Some(part(i)));
            let parts: Vec<IndexPart<E>> =
                parts.into_iter().map(|p| p.expect("for_each_mut runs every part")).collect();
            let mut jobs: Vec<Option<GatherJob>> =
                Self::jobs(&parts, &shape, threads, off, out, pos).into_iter().map(Some).collect();
            crate::host::for_each_mut(&mut jobs, &|_, job| {
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
    pub(super) fn set_ranges(
        s: &SetCollection,
        prefix: &[u32],
        threads: usize,
        per_thread: usize,
    ) -> (Vec<usize>, usize) {
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
    pub(super) fn partition<E: IndexEntry>(
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
    pub(super) fn jobs<'a, E>(
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
    pub(super) fn gather<E: IndexEntry>(parts: &[IndexPart<E>], shape: &IndexShape, job: GatherJob) {
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

pub(super) struct Plan<'a> {
    pub(super) r: &'a SetCollection,
    pub(super) s: &'a SetCollection,
    pub(super) self_join: bool,
    pub(super) tables: Tables,
    pub(super) index: PrefixIndex,
    pub(super) s_sizes: Vec<u32>,
}

/// What the prefix index build needs besides the sets, with the tables.
pub(super) struct Layout {
    pub(super) tables: Tables,
    pub(super) s_sizes: Vec<u32>,
    /// Index prefix length per indexed set size.
    pub(super) index_prefix: Vec<u32>,
    /// One past the largest token of either side.
    pub(super) vocab: usize,
}

impl<'a> Plan<'a> {
    /// Length tables and prefix index; `with_positions`: record each index
    /// entry's token position (the CPU backend's positional filter).
    pub(super) fn new(
        r: &'a SetCollection,
        s: Option<&'a SetCollection>,
        thr: Threshold,
        with_positions: bool,
        threads: usize,
    ) -> Self {
        let Layout { tables, s_sizes, index_prefix, vocab } = Self::layout(r, s, thr);
        let self_join = s.is_none();
        let s = s.unwrap_or(r);
        let index = PrefixIndex::build(s, &index_prefix, vocab, with_positions, threads, INDEX_WORK_PER_THREAD);
        Plan { r, s, self_join, tables, index, s_sizes }
    }

    /// Length tables, index prefix lengths and vocabulary (serial, O(sets)).
    pub(super) fn layout(r: &SetCollection, s: Option<&SetCollection>, thr: Threshold) -> Layout {
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
    pub(super) fn window(&self, x: usize) -> (u32, u32) {
        let a = self.r.size(x) as usize;
        let (lo, mut hi) = (self.tables.lo_pos[a], self.tables.hi_pos[a]);
        if self.self_join {
            hi = hi.min(x as u32);
        }
        (lo, hi.max(lo))
    }

    pub(super) fn pair(&self, x: u32, y: u32, o: u32) -> Pair {
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
pub(super) fn overlap_at_least(x: &[u32], y: &[u32], need: u32) -> Option<u32> {
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

impl JoinStats {
    /// Count another run's counters into these (EXPLAIN ANALYZE's sums).
    pub fn add(&mut self, other: &JoinStats) {
        self.candidates += other.candidates;
        self.results += other.results;
        self.blocks += other.blocks;
        self.hits += other.hits;
        self.plan += other.plan;
        self.transfer.add(&other.transfer);
    }
}
