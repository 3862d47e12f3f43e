//! Seed 001 (the thesis on GPU sort, hash, bitmap and search strategies for
//! set intersection), cases B1-B8 of its digest. Its figures are from a
//! discrete GPU of ~2013 over PCIe against tbb / std on its host; every GPU
//! time runs from the first upload until the result is in host memory.

use datafusion::error::Result;
use setfusion::algo::radix_sort;
use setfusion::algo::select::{select_cpu, select_gpu, select_gpu_auto, GpuStrategy, SetOp};
use setfusion::algo::sorted_intersect::{intersect_count_cpu, SortedIntersect};
use setfusion::gpu::{Gpu, TransferStats};

use super::data::{overlapping_pair, overlapping_sizes, parallel_sort, widen, Rng};
use super::{ms, times, Answers, Bench, Row, Table};

pub(crate) fn table(b: &Bench) -> Result<Table> {
    let mut t = Table::new("Seed 001: sort, hash and search strategies (thesis; ~2013 GPU over PCIe, tbb host)");
    t.notes.push(
        "sets of unique uint32 are mix32 (murmur3's finaliser, a bijection) of consecutive integers, standing in \
         for the thesis's LFSR; a common fraction c of n shares c*n keys exactly, so every count is known by \
         construction"
            .into(),
    );
    t.notes.push(
        "GPU: setfusion's radix sort (sort), its merge-path sorted intersection (sorted), its hash selection \
         (unsorted: the keys widened to setfusion's u64 key layout on the host, timed). CPU: std's sort \
         (sort_unstable), a parallel sort on the host's threads standing in for tbb::parallel_sort, a two-pointer \
         merge join, and the two-pass bucketing reference as setfusion's CPU hash selection (keys radix-partitioned \
         over the host's threads in two passes, count then place, then a hash table a bucket)"
            .into(),
    );
    t.notes.push(b.cuda_note.clone());
    let sizes: &[u32] = if b.quick { &[12, 14] } else { &[12, 16, 20, 24] };
    for &log2 in sizes {
        t.rows.push(sort_case(b, 1 << log2, false)?);
    }
    for &log2 in sizes {
        t.rows.push(sort_case(b, 1 << log2, true)?);
    }
    let fractions: &[f64] = if b.quick { &[0.0, 0.1, 1.0] } else { &[0.0, 0.001, 0.1, 0.5, 0.9, 1.0] };
    for &log2 in sizes {
        t.rows.push(symmetric_case(b, 1 << log2, fractions, true)?);
    }
    for &log2 in sizes {
        t.rows.push(symmetric_case(b, 1 << log2, fractions, false)?);
    }
    let totals: &[u32] = if b.quick { &[13] } else { &[17, 19, 21, 23, 25] };
    for &log2 in totals {
        t.rows.push(asymmetric_case(b, 1 << log2)?);
    }
    if b.quick {
        t.rows.push(Row::not_run("B6 out of core", "512M: sorted 2293 ms, unsorted 4400 ms", "--quick"));
    } else {
        for log2 in [25, 29] {
            t.rows.push(out_of_core_case(b, 1 << log2)?);
        }
    }
    t.rows.push(Row::not_run(
        "B7 Bloom pre-filter ablation",
        "qualitative: filters help only at <= 128k and low overlap; LHS fastest without one",
        "setfusion's exact strategies have no Bloom pre-filter (the thesis finds its best hash strategy fastest \
         without one); B3 / B4 at 0.1% and 90% are the no-filter column",
    ));
    t.rows.push(transfer_case(b, if b.quick { 1 << 16 } else { 1 << 24 })?);
    Ok(t)
}

/// The order-preserving u32 image of an f32 (negative floats flipped whole,
/// positive ones with the sign bit set), so an unsigned sort orders floats.
fn float_image(f: f32) -> u32 {
    let b = f.to_bits();
    if b >> 31 == 1 {
        !b
    } else {
        b | 0x8000_0000
    }
}

/// `f` over `v`'s elements in place, on the host's threads.
fn par_apply<T: Send + Copy>(v: &mut [T], f: impl Fn(T) -> T + Sync) {
    let chunk = v.len().div_ceil(64).max(1 << 16);
    let mut parts: Vec<&mut [T]> = v.chunks_mut(chunk).collect();
    setfusion::host::for_each_mut(&mut parts, &|_, c| c.iter_mut().for_each(|x| *x = f(*x)));
}

/// B1 (keys) / B2 (key + 32-bit value): n random floats.
fn sort_case(b: &Bench, n: usize, pairs: bool) -> Result<Row> {
    let mut rng = Rng::new(n as u64);
    let keys: Vec<f32> = (0..n).map(|_| rng.unit() as f32).collect();
    let mut want: Vec<u32> = keys.iter().map(|&f| float_image(f)).collect();
    want.sort_unstable();
    let mut parts = Vec::new();
    let mut answers = Answers::Unchecked;
    let mut gpu_ms = None;
    if let Some(r) = b.on_gpu(|gpu| b.time(true, || gpu_sort(gpu, &keys, pairs))) {
        let (t, (sorted, values)) = r?;
        gpu_ms = Some(t);
        parts.push(format!("GPU radix sort {}", ms(t)));
        let values_ok = values.is_none_or(|v| v.iter().zip(&sorted).all(|(&i, &k)| float_image(keys[i as usize]) == k));
        answers = Answers::check(sorted == want && values_ok, || format!("GPU sort of {n} differs"));
    }
    let (t_std, _) = if pairs {
        b.time_each(
            || keys.iter().enumerate().map(|(i, &k)| (k, i as u32)).collect::<Vec<_>>(),
            |mut v| {
                v.sort_unstable_by(|x, y| x.0.total_cmp(&y.0));
                Ok(v.len())
            },
        )?
    } else {
        b.time_each(
            || keys.clone(),
            |mut v| {
                v.sort_unstable_by(f32::total_cmp);
                Ok(v.len())
            },
        )?
    };
    // The parallel sort orders u32 images (the float order), pairs packed in a u64.
    let (t_par, _) = if pairs {
        b.time_each(
            || keys.iter().enumerate().map(|(i, &k)| (float_image(k) as u64) << 32 | i as u64).collect::<Vec<u64>>(),
            |mut v| {
                parallel_sort(&mut v);
                Ok(v.len())
            },
        )?
    } else {
        b.time_each(
            || keys.iter().map(|&k| float_image(k)).collect::<Vec<u32>>(),
            |mut v| {
                parallel_sort(&mut v);
                Ok(v.len())
            },
        )?
    };
    parts.push(format!("CPU std sort {}, parallel sort {}", ms(t_std), ms(t_par)));
    let image: Vec<u32> = keys.iter().map(|&k| float_image(k)).collect();
    let mut cub_ms = None;
    if let Some(r) = b.with_cuda(|c| c.sort(&image, pairs)) {
        let s = r?;
        parts.push(format!("CUB {}, thrust {}", s.cub.show(), s.thrust.show()));
        answers = answers.and(Answers::check(s.ok, || format!("CUB / thrust sort of {n}")));
        cub_ms = Some(s.cub.total_ms);
    }
    let case = format!(
        "B{} sort {}, n = 2^{}",
        if pairs { 2 } else { 1 },
        if pairs { "key + value" } else { "keys" },
        n.trailing_zeros()
    );
    let paper = match (pairs, n) {
        (false, 1_048_576) => "1M: MISCB 8.37 ms, BSL 9.33, tbb 26 ms, std::sort 101 ms",
        (false, 16_777_216) => "16M: MISCB 150 ms, BSL 182, tbb 470 ms, std::sort 1917 ms",
        (true, 16_777_216) => "16M: MISCB 223 ms, MSCBS32 236, BSL 315, tbb 519 ms, std::sort 1995 ms",
        (false, _) => "GPU beats std::sort from 8k and tbb above 32k; ~3.1x tbb, ~12.4x std at 16M",
        (true, _) => "~2.4x tbb, ~9x std at 16M; transfers 50-60% of the total",
    };
    let paper_gpu = match (pairs, n) {
        (false, 1_048_576) => Some(8.368),
        (false, 16_777_216) => Some(150.09),
        (true, 16_777_216) => Some(223.04),
        _ => None,
    };
    let mut ratio = match (gpu_ms, paper_gpu) {
        (Some(g), Some(p)) => format!("{} MISCB; {} our parallel sort", times(p, g), times(t_par, g)),
        (Some(g), None) => format!("{} our parallel sort", times(t_par, g)),
        _ => "-".into(),
    };
    if let (Some(g), Some(c)) = (gpu_ms, cub_ms) {
        ratio += &format!("; {} CUB", times(c, g));
    }
    Ok(Row::new(case, paper, parts.join("; ")).ratio(ratio).answers(answers))
}

/// Upload, sort on the device, download (keys, and values 0..n with `pairs`).
fn gpu_sort(gpu: &Gpu, keys: &[f32], pairs: bool) -> Result<(Vec<u32>, Option<Vec<u32>>)> {
    let mut stats = TransferStats::default();
    let n = keys.len();
    let mut image: Vec<u32> = vec![0; n];
    image.iter_mut().zip(keys).for_each(|(i, &k)| *i = k.to_bits());
    par_apply(&mut image, |bits| float_image(f32::from_bits(bits)));
    let mut d_keys = gpu.upload(&image, &mut stats)?;
    if pairs {
        let values: Vec<u32> = (0..n as u32).collect();
        let mut d_values = gpu.upload(&values, &mut stats)?;
        radix_sort::sort_pairs_u32(gpu, &mut d_keys, &mut d_values, n, 0, 32)?;
        let v = gpu.download(&d_values, n, &mut stats)?;
        Ok((gpu.download(&d_keys, n, &mut stats)?, Some(v)))
    } else {
        radix_sort::sort_keys(gpu, &mut d_keys, n, 0, 32)?;
        Ok((gpu.download(&d_keys, n, &mut stats)?, None))
    }
}

/// Sorted intersection on the device: the count, and the matches as one bit
/// per key of `a` in host memory (the result).
fn gpu_sorted(gpu: &Gpu, a: &[u32], bb: &[u32]) -> Result<u64> {
    let mut stats = TransferStats::default();
    let words = a.len().div_ceil(32).max(1);
    let mut si = SortedIntersect::upload(gpu, a, bb, &mut stats)?;
    let flags = gpu.alloc_zeros::<u32>(words)?;
    let n = si.run(gpu, Some(&flags), &mut stats)?;
    let bits = gpu.download(&flags, words, &mut stats)?;
    let set: u64 = bits.iter().map(|w| w.count_ones() as u64).sum();
    if set != n {
        return Err(datafusion::error::DataFusionError::Internal(format!("{set} match bits for a count of {n}")));
    }
    Ok(n)
}

/// Unsorted intersection by setfusion's hash selection: keys widened to u64,
/// `build` hashed, one bit per `probe` key back in host memory.
fn gpu_hash(gpu: &Gpu, build: &[u32], probe: &[u32]) -> Result<u64> {
    let (wb, wp) = (widen(build), widen(probe));
    let sel = select_gpu(gpu, GpuStrategy::Hash, SetOp::Semi, &wb, &wp, &mut TransferStats::default())?;
    Ok(sel.count_set_bits() as u64)
}

/// B3 (sorted) / B4 (unsorted): two sets of n, each common fraction.
fn symmetric_case(b: &Bench, n: usize, fractions: &[f64], sorted: bool) -> Result<Row> {
    let mut cells = Vec::new();
    let mut answers = Answers::Unchecked;
    let mut at_10 = None;
    let mut thrust_at_10 = None;
    for &c in fractions {
        let common = (n as f64 * c).round() as usize;
        let (mut a, mut bb) = overlapping_pair(n, common);
        if sorted {
            parallel_sort(&mut a);
            parallel_sort(&mut bb);
        }
        let mut parts: Vec<String> = Vec::new();
        let gpu =
            b.on_gpu(|gpu| b.time(true, || if sorted { gpu_sorted(gpu, &a, &bb) } else { gpu_hash(gpu, &a, &bb) }));
        if let Some(r) = gpu {
            let (t, count) = r?;
            parts.push(format!("GPU {}", ms(t)));
            answers = answers.and(Answers::check(count == common as u64, || format!("n {n} c {c}: GPU {count}")));
            if c == 0.1 {
                at_10 = Some(t);
            }
        }
        if c == 0.1 {
            if let Some(r) = b.with_cuda(|h| h.set_op("intersection", sorted, &a, &bb)) {
                let (count, t) = r?;
                parts.push(format!("thrust {}", t.show()));
                answers =
                    answers.and(Answers::check(count == common as u64, || format!("n {n} c {c}: thrust {count}")));
                thrust_at_10 = Some(t.total_ms);
            }
        }
        if sorted {
            let (t, count) = b.time(false, || Ok(intersect_count_cpu(&a, &bb, None)))?;
            parts.push(format!("merge join {}", ms(t)));
            answers = answers.and(Answers::check(count == common as u64, || format!("n {n} c {c}: merge {count}")));
        } else {
            let (t, sel) = b.time(false, || Ok(select_cpu(SetOp::Semi, &widen(&a), &widen(&bb))))?;
            parts.push(format!("CPU two-pass bucketing {}", ms(t)));
            let count = sel.count_set_bits();
            answers = answers.and(Answers::check(count == common, || format!("n {n} c {c}: CPU hash {count}")));
            if c == 0.1 {
                let (t, count) = b.time_each(
                    || (a.clone(), bb.clone()),
                    |(mut x, mut y)| {
                        parallel_sort(&mut x);
                        parallel_sort(&mut y);
                        Ok(intersect_count_cpu(&x, &y, None))
                    },
                )?;
                parts.push(format!("parallel sort + merge join {}", ms(t)));
                answers = answers.and(Answers::check(count == common as u64, || "sort + merge".into()));
            }
        }
        cells.push(format!("{}%: {}", c * 100.0, parts.join(" / ")));
    }
    let (case, paper, paper_gpu) = if sorted {
        (
            format!("B3 sorted, 2 x 2^{}", n.trailing_zeros()),
            "16M / 10%: ISS 70.5 ms, LSJCCPUS 75.5, BSS 76.2, CPU merge join 160 ms, transfers alone 60.5 ms; \
             GPU/CPU ~2.4x at 0%, CPU faster at 100%",
            70.47,
        )
    } else {
        (
            format!("B4 unsorted, 2 x 2^{}", n.trailing_zeros()),
            "16M / 10%: LHS 110 ms, LHB 113, ILBN 122, CHG 131; tbb sort + merge join 872 ms, two-pass \
             bucketing 329 ms; transfers 60.2 ms",
            109.73,
        )
    };
    let mut ratio = match (n, at_10) {
        (16_777_216, Some(t)) => format!("{} the paper's best GPU at 10%", times(paper_gpu, t)),
        _ => "-".into(),
    };
    if let (Some(g), Some(th)) = (at_10, thrust_at_10) {
        let vs = format!("{} thrust at 10%", times(th, g));
        ratio = if ratio == "-" { vs } else { format!("{ratio}; {vs}") };
    }
    Ok(Row::new(case, paper, cells.join("; ")).ratio(ratio).answers(answers))
}

/// B5: total keys split 1 : (2^i - 1), in both orders, sharing min(4096, small) keys.
fn asymmetric_case(b: &Bench, total: usize) -> Result<Row> {
    // 1:15 is the digest's worst case for search strategies (the larger set first).
    let splits: &[u32] = if b.quick { &[1, 3] } else { &[1, 4, 5, 9, 13] };
    let mut cells = Vec::new();
    let mut answers = Answers::Unchecked;
    let mut at_4096 = None;
    for &i in splits {
        let small = total >> i;
        let large = total - small;
        let common = small.min(4096);
        let (mut s, mut l) = overlapping_sizes(small, large, common);
        parallel_sort(&mut s);
        parallel_sort(&mut l);
        let mut orders = Vec::new();
        for (first, second, order) in [(&s, &l, "small first"), (&l, &s, "large first")] {
            let mut parts: Vec<String> = Vec::new();
            if let Some(r) = b.on_gpu(|gpu| b.time(true, || gpu_sorted(gpu, first, second))) {
                let (t, count) = r?;
                parts.push(format!("GPU sorted {}", ms(t)));
                answers = answers.and(Answers::check(count == common as u64, || format!("1:{i} sorted {count}")));
                if small == 4096 && order == "small first" {
                    at_4096 = Some(t);
                }
            }
            if let Some(r) = b.on_gpu(|gpu| b.time(true, || gpu_hash(gpu, first, second))) {
                let (t, count) = r?;
                parts.push(format!("GPU hash {}", ms(t)));
                answers = answers.and(Answers::check(count == common as u64, || format!("1:{i} hash {count}")));
            }
            let (t, out) = b.time(false, || {
                Ok(setfusion::algo::sorted_intersect::sorted_intersect_with(
                    setfusion::algo::sorted_intersect::IntersectMethod::Auto,
                    first,
                    second,
                ))
            })?;
            parts.push(format!("CPU merge / gallop {}", ms(t)));
            answers = answers.and(Answers::check(out.len() == common, || format!("1:{i} CPU {}", out.len())));
            orders.push(format!("{order}: {}", parts.join(", ")));
        }
        cells.push(format!("1:{} {}", (1usize << i) - 1, orders.join("; ")));
    }
    let ratio = match (total, at_4096) {
        (33_554_432, Some(t)) => format!("{} ISS at 4096 first", times(63.28, t)),
        _ => "-".into(),
    };
    Ok(Row::new(
        format!("B5 asymmetric, total 2^{}", total.trailing_zeros()),
        "2^25: ISS 69.1 ms balanced, 63.3 (4096 first), 72.5 (4096 second); LHS 110 / 77.6 / 126 ms",
        cells.join("; "),
    )
    .ratio(ratio)
    .answers(answers))
}

/// B6: 2 x n unique keys, 10% common, sorted and unsorted, on the device in
/// one piece or in partitions as setfusion's budget decides.
fn out_of_core_case(b: &Bench, n: usize) -> Result<Row> {
    let common = n / 10;
    let case = format!("B6 out of core, 2 x 2^{}", n.trailing_zeros());
    let paper = "512M: sorted MST + LSJCCPUS 2293 ms, MST + BSS 2368; unsorted MLBB 4400 ms, MBT + LHS 25670 ms \
                 (GPU chunks <= 4M); CPU bucketing ~70 M keys/s";
    let Some(gpu) = &b.gpu else {
        return Ok(Row::not_run(case, paper, "no GPU"));
    };
    let (a, bb) = overlapping_pair(n, common);
    let (wa, wb) = (widen(&a), widen(&bb));
    let (t_hash, (sel, ran)) = b.time(false, || {
        let g = gpu.lease(0);
        let (sel, ran, _) = select_gpu_auto(
            &g,
            None,
            SetOp::Semi,
            &[wa.as_slice()],
            &[wb.as_slice()],
            false,
            &mut TransferStats::default(),
        )?;
        Ok((sel.count_set_bits(), ran))
    })?;
    drop((wa, wb));
    let (mut sa, mut sb) = (a, bb);
    parallel_sort(&mut sa);
    parallel_sort(&mut sb);
    let (t_sorted, count) = b.time(false, || gpu_sorted(&gpu.lease(0), &sa, &sb))?;
    let answers = Answers::check(sel == common && count == common as u64, || format!("hash {sel}, sorted {count}"));
    let ratio = if n == 1 << 29 {
        format!("sorted {}, unsorted {} the paper's best", times(2293.0, t_sorted), times(4400.0, t_hash))
    } else {
        "-".into()
    };
    Ok(Row::new(case, paper, format!("sorted {}; unsorted (widened, {ran}) {}", ms(t_sorted), ms(t_hash)))
        .ratio(ratio)
        .answers(answers))
}

/// B8: two sets of n uint32 uploaded and an empty result downloaded.
fn transfer_case(b: &Bench, n: usize) -> Result<Row> {
    let case = format!("B8 transfers, 2 x 2^{} uint32 up, empty result down", n.trailing_zeros());
    let paper = "2 x 16M: 56.7 ms (88 ms with a full-overlap result)";
    let (a, bb) = overlapping_pair(n, 0);
    match b.on_gpu(|gpu| {
        b.time(true, || {
            let mut stats = TransferStats::default();
            let da = gpu.upload(&a, &mut stats)?;
            let db = gpu.upload(&bb, &mut stats)?;
            let back = gpu.download(&da, 1, &mut stats)?;
            drop(db);
            Ok(back.len())
        })
    }) {
        Some(r) => {
            let (t, _) = r?;
            let gbs = (2 * n * 4) as f64 / (t / 1e3) / 1e9;
            let ratio = if n == 1 << 24 { times(56.7, t) } else { "-".into() };
            Ok(Row::new(case, paper, format!("{} ({gbs:.1} GB/s)", ms(t))).ratio(ratio))
        }
        None => Ok(Row::not_run(case, paper, "no GPU")),
    }
}
