//! Seed 003 (Manseur et al.: GTWJ, sequence skipping for sorted-list
//! intersection), cases C1-C7 of its digest. The paper ran on a GeForce
//! 840M; its only absolute figures are 1.34 µs and 6.33 µs. Comparisons and
//! skipped cells are hardware-independent, so they are counted here by a
//! model of each algorithm (the same walk as setfusion's GTWJ twin,
//! `sorted_intersect_sequences`, with counters), and setfusion's GPU GTWJ
//! (`sorted_intersect` on one list row, transfers included) is timed beside
//! the CPU merge.

use std::cmp::Ordering;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, ListArray};
use datafusion::arrow::datatypes::Int64Type;
use datafusion::error::Result;
use setfusion::algo::multiset::{list_op_gpu, ListOp};
use setfusion::algo::sorted_intersect::{sorted_intersect_sequences, sorted_intersect_with, IntersectMethod};
use setfusion::gpu::TransferStats;

use super::data::{sorted_set, Dist};
use super::{ms, Answers, Bench, Row, Table};

/// The universe the lists are drawn from (the paper does not state one).
const UNIVERSE: u64 = 1 << 20;

/// What a walk did.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    out: usize,
    /// Element against element.
    element: u64,
    /// SeqID against SeqID (GTWJ only).
    sequence: u64,
    /// Elements never compared (in skipped sequences, or after the end).
    skipped: u64,
}

impl Counts {
    fn comparisons(&self) -> u64 {
        self.element + self.sequence
    }
}

/// The naive two-pointer merge (Hwang & Lin).
fn naive(a: &[u32], b: &[u32]) -> Counts {
    let mut c = Counts::default();
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        c.element += 1;
        match a[i].cmp(&b[j]) {
            Ordering::Less => i += 1,
            Ordering::Greater => j += 1,
            Ordering::Equal => {
                c.out += 1;
                i += 1;
                j += 1;
            }
        }
    }
    c.skipped = (a.len() - i + b.len() - j) as u64;
    c
}

/// SvS: each element of the shorter list searched in the longer one by
/// galloping (exponential, then binary search) from the last position.
fn svs(a: &[u32], b: &[u32]) -> Counts {
    let (small, large) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    let mut c = Counts::default();
    let mut from = 0;
    for &x in small {
        // Exponential search from the last position for a key >= x: `lo` stays
        // past every key known to be smaller.
        let (mut lo, mut hi, mut step) = (from, from, 1);
        while hi < large.len() {
            c.element += 1;
            if large[hi] >= x {
                break;
            }
            lo = hi + 1;
            hi = from + step;
            step *= 2;
        }
        // Then a binary search of [lo, hi) for the first key >= x.
        let mut hi = hi.min(large.len());
        while lo < hi {
            c.element += 1;
            let mid = (lo + hi) / 2;
            if large[mid] < x {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        from = lo;
        if from < large.len() {
            c.element += 1;
            if large[from] == x {
                c.out += 1;
                from += 1;
            }
        }
    }
    c
}

/// GTWJ with sequencing value `val`: sequences (SeqID = x / val) compared by
/// id; only sequences of equal id are merged element by element.
fn gtwj(a: &[u32], b: &[u32], val: u32) -> Counts {
    let seqs = |v: &[u32]| -> Vec<(u32, usize, usize)> {
        let mut s: Vec<(u32, usize, usize)> = Vec::new();
        for (k, &x) in v.iter().enumerate() {
            match s.last_mut() {
                Some(last) if last.0 == x / val => last.2 = k + 1,
                _ => s.push((x / val, k, k + 1)),
            }
        }
        s
    };
    let (sa, sb) = (seqs(a), seqs(b));
    let mut c = Counts::default();
    let (mut p, mut q) = (0, 0);
    while p < sa.len() && q < sb.len() {
        c.sequence += 1;
        match sa[p].0.cmp(&sb[q].0) {
            Ordering::Less => {
                c.skipped += (sa[p].2 - sa[p].1) as u64;
                p += 1;
            }
            Ordering::Greater => {
                c.skipped += (sb[q].2 - sb[q].1) as u64;
                q += 1;
            }
            Ordering::Equal => {
                let m = naive(&a[sa[p].1..sa[p].2], &b[sb[q].1..sb[q].2]);
                c.out += m.out;
                c.element += m.element;
                p += 1;
                q += 1;
            }
        }
    }
    c.skipped += sa[p.min(sa.len())..].iter().chain(&sb[q.min(sb.len())..]).map(|s| (s.2 - s.1) as u64).sum::<u64>();
    c
}

pub(crate) fn table(b: &Bench) -> Result<Table> {
    let mut t = Table::new("Seed 003: GTWJ sorted-list intersection (Manseur et al.; GeForce 840M)");
    t.notes.push(format!(
        "lists of unique keys uniform over a universe of 2^{} (the paper states none); comparisons = element \
         comparisons + SeqID comparisons; skipped = elements never compared; GTWJ<Val> walks sequences of \
         width Val. setfusion's GPU GTWJ sizes its sequences per row (about 8 elements of the longer list)",
        UNIVERSE.trailing_zeros()
    ));
    let scale = if b.quick { 10 } else { 1 };
    let vals: &[u32] = &[50, 100, 500, 1000, 5000, 10000];
    t.rows.push(val_sweep(
        b,
        "C1",
        50_000 / scale,
        50_000 / scale,
        vals,
        "time and comparisons rise with Val, skipped cells fall; best at 100",
    )?);
    t.rows.push(val_sweep(
        b,
        "C2",
        1_000 / scale,
        100_000 / scale,
        vals,
        "best time at Val 100-500, fewest comparisons at 100",
    )?);
    for n in [1_000, 5_000, 10_000, 25_000, 50_000] {
        t.rows.push(variants(
            b,
            "C3",
            n / scale,
            n / scale,
            "time SvS > Naive > Inoue > GTWJ, GTWJ100 fastest and fewest comparisons",
        )?);
    }
    for n in [1_000, 2_500, 5_000, 10_000] {
        t.rows.push(variants(
            b,
            "C4",
            n / scale,
            50_000 / scale,
            "GTWJ100 fastest; SvS, Naive, Inoue slowest first; baselines touch every cell",
        )?);
    }
    t.rows.push(gtwj50_vs_100(scale));
    t.rows.push(Row::not_run(
        "C6 total-thread sweep, 50000 / 50000",
        "Inoue best near 1000 threads; GTWJ100 flat",
        "setfusion launches one thread per sequence over all rows (its launch is sized by the data, not swept); \
         Inoue's algorithm stands in C3 / C4 as seed 004's SIMD block intersection, on the host (not swept)",
    ));
    t.rows.push(Row::not_run(
        "C7 threads-per-block sweep, 10000 / 50000",
        "GTWJ100 best at 16 threads per block, 6.33 µs; beats Inoue everywhere",
        "the block size is fixed per kernel in kernels/sorted_intersect.cu; its tile shapes are swept by `bench setops`",
    ));
    Ok(t)
}

fn lists(na: usize, nb: usize) -> (Vec<u32>, Vec<u32>) {
    (
        sorted_set(Dist::Uniform, UNIVERSE, na, na as u64 * 31 + 1),
        sorted_set(Dist::Uniform, UNIVERSE, nb, nb as u64 * 17 + 2),
    )
}

/// The answers every model and setfusion's CPU twins give, against the merge.
fn check(a: &[u32], b: &[u32], vals: &[u32], want: usize) -> Answers {
    let mut answers = Answers::Match;
    for &v in vals {
        let got = gtwj(a, b, v).out;
        answers = answers.and(Answers::check(got == want, || format!("GTWJ{v} model: {got}")));
        let twin = sorted_intersect_sequences(a, b, v as u64).len();
        answers = answers.and(Answers::check(twin == want, || format!("GTWJ{v} twin: {twin}")));
    }
    let s = svs(a, b).out;
    answers.and(Answers::check(s == want, || format!("SvS: {s}")))
}

/// setfusion's GPU GTWJ on one row (transfers included): the time and the size of the result.
fn gpu_gtwj(b: &Bench, a: &[u32], bb: &[u32]) -> Option<Result<(f64, usize)>> {
    let row = |v: &[u32]| -> ArrayRef {
        Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>([Some(v.iter().map(|&x| Some(x as i64)))]))
    };
    let (la, lb) = (row(a), row(bb));
    b.on_gpu(|g| {
        let (t, out) =
            b.time(true, || list_op_gpu::<i64>(g, ListOp::SortedIntersect, &la, &lb, &mut TransferStats::default()))?;
        let l = out.as_list::<i32>();
        Ok((t, if l.is_null(0) { 0 } else { l.value(0).len() }))
    })
}

fn val_sweep(b: &Bench, case: &str, na: usize, nb: usize, vals: &[u32], paper: &str) -> Result<Row> {
    let (a, bb) = lists(na, nb);
    let want = naive(&a, &bb);
    let mut cells = vec![format!("naive {} cmp", want.comparisons())];
    for &v in vals {
        let c = gtwj(&a, &bb, v);
        let (t, _) = b.time(false, || Ok(sorted_intersect_sequences(&a, &bb, v as u64).len()))?;
        cells.push(format!(
            "Val {v}: {} cmp, {:.0}% skipped, CPU {}",
            c.comparisons(),
            100.0 * c.skipped as f64 / (na + nb) as f64,
            ms(t)
        ));
    }
    Ok(Row::new(format!("{case} Val sweep, {na} / {nb}"), paper, cells.join("; "))
        .answers(check(&a, &bb, vals, want.out)))
}

fn variants(b: &Bench, case: &str, na: usize, nb: usize, paper: &str) -> Result<Row> {
    let (a, bb) = lists(na, nb);
    let want = naive(&a, &bb);
    let vals = [100, 1000, 5000, 10000];
    let mut cells = vec![format!("naive {} cmp", want.comparisons()), format!("SvS {}", svs(&a, &bb).comparisons())];
    for v in vals {
        cells.push(format!("GTWJ{v} {}", gtwj(&a, &bb, v).comparisons()));
    }
    let (t_merge, _) = b.time(false, || Ok(sorted_intersect_with(IntersectMethod::Merge, &a, &bb).len()))?;
    cells.push(format!("CPU merge {}", ms(t_merge)));
    // Inoue et al.'s SIMD block merge: seed 004's SIMD baseline (blocks of 8 x 8) stands for it.
    let (t_blocks, blocks) = b.time(false, || Ok(crate::bench::seeds::simd_count(&a, &bb)))?;
    cells.push(format!("CPU SIMD blocks (for Inoue) {}", ms(t_blocks)));
    let mut answers = check(&a, &bb, &vals, want.out)
        .and(Answers::check(blocks == want.out as u64, || format!("SIMD blocks: {blocks}")));
    if let Some(r) = gpu_gtwj(b, &a, &bb) {
        let (t, n) = r?;
        cells.push(format!("GPU GTWJ {}", ms(t)));
        answers = answers.and(Answers::check(n == want.out, || format!("GPU: {n}")));
    }
    let g100 = gtwj(&a, &bb, 100).comparisons() as f64;
    Ok(Row::new(format!("{case} {na} / {nb}"), paper, cells.join(", "))
        .ratio(format!("GTWJ100 makes {:.2}x naive's comparisons", g100 / want.comparisons().max(1) as f64))
        .answers(answers))
}

/// C5: GTWJ50 against GTWJ100 by comparisons over sizes.
fn gtwj50_vs_100(scale: usize) -> Row {
    let mut cells = Vec::new();
    let mut answers = Answers::Match;
    for n in [1_000, 2_500, 5_000, 10_000, 50_000] {
        let n = n / scale;
        let (a, bb) = lists(n, n);
        let want = naive(&a, &bb).out;
        answers = answers.and(check(&a, &bb, &[50, 100], want));
        cells.push(format!("{n}: {} vs {}", gtwj(&a, &bb, 50).comparisons(), gtwj(&a, &bb, 100).comparisons()));
    }
    Row::new(
        "C5 GTWJ50 vs GTWJ100 (comparisons)",
        "GTWJ50 faster below ~5000, GTWJ100 above; largest gap 1.34 µs",
        cells.join("; "),
    )
    .answers(answers)
}
