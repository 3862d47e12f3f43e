//! Seed 002 (moderngpu's Multisets: Balanced Path), cases B1-B2 of its
//! digest, through setfusion's list functions (`set_intersect_all`,
//! `set_union_all`, `set_except_all`, `set_symmetric_difference`), whose GPU
//! path is Balanced Path per row and whose CPU twin is one std::set_*-style
//! merge. The seed prints no figures (its charts were images), so the
//! baseline is the CPU merge measured here.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, ListArray};
use datafusion::arrow::datatypes::{Int32Type, Int64Type};
use datafusion::error::Result;
use setfusion::algo::multiset::{list_op_cpu, list_op_gpu, moderngpu_example, multiset_op, ListOp, MultisetOp};
use setfusion::gpu::TransferStats;

use super::data::Rng;
use super::{ms, times, Answers, Bench, Row, Table};

pub(crate) fn table(b: &Bench) -> Result<Table> {
    let mut t = Table::new("Seed 002: moderngpu Multisets, Balanced Path (no figures survive in the seed)");
    t.notes.push(
        "B2 follows the repository's harness: a total of `count` keys, A and B half each, uniform over [0, count] \
         and sorted (so duplicates occur), one list row per side; GPU: `list_op_gpu` (the host's cast, upload, \
         Balanced Path, download of the Arrow list); CPU: the std::set_* merge on the same keys"
            .into(),
    );
    t.notes.push(format!("{} (thrust's set_* of the same sorted keys, the seed's named baseline)", b.cuda_note));
    t.rows.push(worked_example(b)?);
    t.rows.push(demo(b)?);
    t.rows.push(fuzz(b)?);
    let totals: &[usize] = if b.quick {
        &[10_000, 100_000]
    } else {
        &[10_000, 50_000, 100_000, 200_000, 500_000, 1_000_000, 2_000_000, 5_000_000, 10_000_000, 20_000_000]
    };
    for &count in totals {
        t.rows.push(throughput(b, count, false)?);
    }
    for &count in if b.quick { &[100_000][..] } else { &[1_000_000, 20_000_000][..] } {
        t.rows.push(throughput(b, count, true)?);
    }
    t.rows.push(Row::not_run(
        "B2 pairs (keys + values)",
        "no figure",
        "setfusion's multiset functions take list columns, whose elements are their own values (no key-value form)",
    ));
    Ok(t)
}

fn rows_of(lists: &[Vec<i64>]) -> ArrayRef {
    Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(lists.iter().map(|l| Some(l.iter().map(|&x| Some(x))))))
}

fn values_of(array: &ArrayRef, row: usize) -> Vec<i64> {
    let l = array.as_list::<i32>();
    if l.is_null(row) {
        return Vec::new();
    }
    l.value(row).as_primitive::<Int64Type>().values().to_vec()
}

/// `op` by counting: each key with m copies in `a` and n in `b` appears
/// `op.copies(m, n)` times, ascending (SQL's multiset rules, written apart
/// from the merge).
fn by_counting(op: MultisetOp, a: &[i64], b: &[i64]) -> Vec<i64> {
    let mut counts: BTreeMap<i64, (usize, usize)> = BTreeMap::new();
    a.iter().for_each(|&x| counts.entry(x).or_default().0 += 1);
    b.iter().for_each(|&x| counts.entry(x).or_default().1 += 1);
    counts.into_iter().flat_map(|(x, (m, n))| std::iter::repeat_n(x, op.copies(m, n))).collect()
}

/// Every op on the rows of `a` and `b`: the CPU twin against counting, the
/// GPU (when there is one) against the CPU twin.
fn check_rows(b: &Bench, a: &ArrayRef, bb: &ArrayRef) -> Result<Answers> {
    let mut answers = Answers::Match;
    for op in MultisetOp::ALL {
        let cpu = list_op_cpu::<i64>(ListOp::Multiset(op), a, bb)?;
        for row in 0..a.len() {
            let want = by_counting(op, &values_of(a, row), &values_of(bb, row));
            answers =
                answers.and(Answers::check(values_of(&cpu, row) == want, || format!("{} row {row}", op.sql_name())));
        }
        if let Some(r) = b.on_gpu(|g| list_op_gpu::<i64>(g, ListOp::Multiset(op), a, bb, &mut TransferStats::default()))
        {
            let gpu = r?;
            let same = gpu.len() == cpu.len()
                && (0..cpu.len()).all(|r| gpu.is_null(r) == cpu.is_null(r) && values_of(&gpu, r) == values_of(&cpu, r));
            answers = answers.and(Answers::check(same, || format!("{} GPU", op.sql_name())));
        }
    }
    Ok(answers)
}

/// B1: the page's worked example.
fn worked_example(b: &Bench) -> Result<Row> {
    let (a, bb) = moderngpu_example();
    let want: [(MultisetOp, &[i64]); 4] = [
        (MultisetOp::IntersectAll, &[1, 2, 3, 3, 3, 6, 6, 6, 6, 8]),
        (MultisetOp::UnionAll, &[1, 1, 2, 2, 3, 3, 3, 3, 5, 6, 6, 6, 6, 7, 7, 8, 8, 9]),
        (MultisetOp::ExceptAll, &[1, 5, 7, 7, 8, 9]),
        (MultisetOp::SymmetricDifference, &[1, 2, 3, 5, 7, 7, 8, 9]),
    ];
    let mut answers = check_rows(b, &a, &bb)?;
    let mut sizes = Vec::new();
    for (op, expect) in want {
        let got = values_of(&list_op_cpu::<i64>(ListOp::Multiset(op), &a, &bb)?, 0);
        answers = answers.and(Answers::check(got == expect, || format!("{} of the example", op.sql_name())));
        sizes.push(got.len().to_string());
    }
    let on = if b.gpu.is_some() { "GPU and CPU" } else { "CPU" };
    Ok(Row::new("B1 worked example", "sizes 10 / 18 / 6 / 8 (∩ ∪ − Δ)", format!("{on}: {}", sizes.join(" / ")))
        .answers(answers))
}

/// B1: the demo's shape (N = 100 a side, keys 0..99): the size identities.
fn demo(b: &Bench) -> Result<Row> {
    let mut rng = Rng::new(100);
    let mut side = || {
        let mut v: Vec<i64> = (0..100).map(|_| rng.below(100) as i64).collect();
        v.sort_unstable();
        v
    };
    let (va, vb) = (side(), side());
    let (a, bb) = (rows_of(&[va.clone()]), rows_of(&[vb.clone()]));
    let answers = check_rows(b, &a, &bb)?;
    let n = |op: MultisetOp| multiset_op(op, &va, &vb).len();
    let (i, u, d, s) = (
        n(MultisetOp::IntersectAll),
        n(MultisetOp::UnionAll),
        n(MultisetOp::ExceptAll),
        n(MultisetOp::SymmetricDifference),
    );
    let identities = u == 200 - i && s == 200 - 2 * i && d == 100 - i;
    Ok(Row::new(
        "B1 demo, N = 100, keys 0..99",
        "∩ 50, Δ 100 on its random data; size(∪) = size(A) + size(B) − size(∩), size(Δ) = size(A) + size(B) − 2 size(∩)",
        format!("∩ {i}, ∪ {u}, − {d}, Δ {s}"),
    )
    .answers(answers.and(Answers::check(identities, || "size identities".into()))))
}

/// B1: random rows with heavy duplicates (keys over 0..8 and 0..1000, lengths
/// 0 to 2,000 with empty rows), every op.
fn fuzz(b: &Bench) -> Result<Row> {
    let rows = if b.quick { 60 } else { 400 };
    let mut rng = Rng::new(2);
    let mut side = |r: usize| {
        let domain = if r % 2 == 0 { 8 } else { 1000 };
        let len = if r % 7 == 3 { 0 } else { rng.below(2001) as usize };
        let mut v: Vec<i64> = (0..len).map(|_| rng.below(domain) as i64).collect();
        v.sort_unstable();
        v
    };
    let a: Vec<Vec<i64>> = (0..rows).map(&mut side).collect();
    let bb: Vec<Vec<i64>> = (0..rows).map(&mut side).collect();
    let answers = check_rows(b, &rows_of(&a), &rows_of(&bb))?;
    let on = if b.gpu.is_some() { "GPU = CPU = counting" } else { "CPU = counting" };
    Ok(Row::new(
        format!("B1 fuzz, {rows} rows, heavy duplicates"),
        "element-wise equal to std::set_*",
        format!("{on}, all four ops"),
    )
    .answers(answers))
}

/// B2: `count` keys (A and B half each) per op: the GPU's and the CPU
/// merge's M keys/s, and the GPU's GB/s (input and output at the type's width).
fn throughput(b: &Bench, count: usize, int64: bool) -> Result<Row> {
    let mut rng = Rng::new(count as u64);
    let mut side = |n: usize| {
        let mut v: Vec<i64> = (0..n).map(|_| rng.below(count as u64 + 1) as i64).collect();
        v.sort_unstable();
        v
    };
    let (va, vb) = (side(count / 2), side(count - count / 2));
    let width = if int64 { 8 } else { 4 };
    let column = |v: &[i64]| -> ArrayRef {
        if int64 {
            rows_of(&[v.to_vec()])
        } else {
            Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>([Some(v.iter().map(|&x| Some(x as i32)))]))
        }
    };
    let (a, bb) = (column(&va), column(&vb));
    let mut cells = Vec::new();
    let mut answers = Answers::Unchecked;
    let mut ratios = Vec::new();
    for op in MultisetOp::ALL {
        let (t_cpu, want) = b.time(false, || Ok(multiset_op(op, &va, &vb)))?;
        let rate = |t: f64| count as f64 / (t / 1e3) / 1e6;
        let mut cell = format!("{}: ", symbol(op));
        if let Some(r) = b.on_gpu(|g| {
            b.time(true, || list_op_gpu::<i64>(g, ListOp::Multiset(op), &a, &bb, &mut TransferStats::default()))
        }) {
            let (t, got) = r?;
            let gbs = (width * (count + want.len())) as f64 / (t / 1e3) / 1e9;
            cell += &format!("GPU {:.0} M/s ({gbs:.1} GB/s, {}), ", rate(t), ms(t));
            answers = answers.and(Answers::check(values_of(&got, 0) == want, || format!("{} GPU", op.sql_name())));
            ratios.push(format!("{} {}", symbol(op), times(t_cpu, t)));
        } else {
            answers = answers.and(Answers::check(want.len() == by_counting(op, &va, &vb).len(), || {
                format!("{} CPU", op.sql_name())
            }));
        }
        cell += &format!("CPU {:.0} M/s", rate(t_cpu));
        if let Some(r) = b.with_cuda(|h| {
            if int64 {
                let (x, y): (Vec<u64>, Vec<u64>) =
                    (va.iter().map(|&v| v as u64).collect(), vb.iter().map(|&v| v as u64).collect());
                h.set_op(thrust_name(op), true, &x, &y)
            } else {
                let (x, y): (Vec<u32>, Vec<u32>) =
                    (va.iter().map(|&v| v as u32).collect(), vb.iter().map(|&v| v as u32).collect());
                h.set_op(thrust_name(op), true, &x, &y)
            }
        }) {
            let (count, t) = r?;
            cell += &format!(", thrust {:.0} M/s ({})", rate(t.total_ms), t.show());
            answers =
                answers.and(Answers::check(count == want.len() as u64, || format!("{} thrust {count}", op.sql_name())));
        }
        cells.push(cell);
    }
    let ratio = if ratios.is_empty() { "-".into() } else { format!("GPU / CPU: {}", ratios.join(", ")) };
    Ok(Row::new(
        format!("B2 keys, {} total, {}", count, if int64 { "int64" } else { "int32" }),
        "no figure (charts lost); the harness verifies against std::set_*",
        cells.join("; "),
    )
    .ratio(ratio)
    .answers(answers))
}

/// thrust's name of `op` (std::set_* semantics, as setfusion's).
fn thrust_name(op: MultisetOp) -> &'static str {
    match op {
        MultisetOp::IntersectAll => "intersection",
        MultisetOp::UnionAll => "union",
        MultisetOp::ExceptAll => "difference",
        MultisetOp::SymmetricDifference => "symmetric_difference",
    }
}

fn symbol(op: MultisetOp) -> &'static str {
    match op {
        MultisetOp::IntersectAll => "∩",
        MultisetOp::UnionAll => "∪",
        MultisetOp::ExceptAll => "−",
        MultisetOp::SymmetricDifference => "Δ",
    }
}
