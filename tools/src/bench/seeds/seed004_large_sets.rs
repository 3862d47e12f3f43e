//! Seed 004 (Bellas & Gounaris: large set intersection on GPUs), cases B3-B7
//! of its digest (B1-B2 are seed 002's). The paper ran on a Titan XP (12 GB)
//! with an i7 5820k; its bar heights are not in the text, only its ratios.
//! Like the paper, every technique here computes the intersection's count.

use datafusion::error::Result;
use setfusion::algo::families::{Family, InvertedLists, PairSpace};
use setfusion::algo::overlap::{self, OverlapMethod};
use setfusion::algo::select::{select_gpu, GpuStrategy, SetOp};
use setfusion::algo::sorted_intersect::{intersect_count_cpu, sorted_intersect_with, IntersectMethod, SortedIntersect};
use setfusion::gpu::{Gpu, TransferStats};
use std::sync::OnceLock;

use super::data::{sorted_set, widen, Dist, Rng};
use super::{block_on, ms, times, Answers, Bench, Row, Table};

pub(crate) fn table(b: &Bench) -> Result<Table> {
    let mut t = Table::new("Seed 004: large set intersection, SISI and MISI (Bellas & Gounaris; Titan XP + i7 5820k)");
    t.notes.push(
        "sets of unique, sorted uint32 drawn until n are distinct: normal (mean E/2, sigma E/8), uniform, zipf \
         (exponent 1, continuous: x = floor(E^u) - 1); the two sets of a pair are drawn independently"
            .into(),
    );
    t.notes.push(
        "GPU (transfers and allocations included, the count back on the host): setfusion's merge-path sorted \
         intersection (the paper's IP), the overlap counts' partitioned search (the paper's IP-OBS, as \
         `intersect_families` runs it) and the hash selection (keys widened to u64, timed); CPU on one thread as \
         the paper's: the merge (std::set_intersection), galloping, the SIMD intersection (Lemire et al.'s \
         blocks of 8 x 8 compared at once, as safe Rust the compiler vectorizes for x86-64's baseline SSE2, not \
         their hand-written SSE4 / AVX code) and a bitmap of the universe (boost::dynamic_bitset, allocation \
         included)"
            .into(),
    );
    t.notes.push(format!("{} (thrust::set_intersection of the sorted pair)", b.cuda_note));
    let (universes, sizes): (&[u64], &[usize]) =
        if b.quick { (&[1_000_000], &[10_000]) } else { (&[1_000_000_000, 100_000_000], &[10_000_000, 1_000_000]) };
    // SETFUSION_SEEDS_ONLY=text[;text..]: only the SISI and MISI cases whose names contain one of them.
    let only = std::env::var("SETFUSION_SEEDS_ONLY").ok();
    let wanted = |name: &str| only.as_deref().is_none_or(|o| o.split(';').any(|o| name.contains(o)));
    for dist in [Dist::Normal, Dist::Uniform, Dist::Zipf] {
        for &e in universes {
            for &n in sizes {
                if wanted(&format!("SISI {}-10^{}-10^{}", dist.name(), e.ilog10(), n.ilog10())) {
                    t.rows.push(sisi(b, dist, e, n)?);
                }
            }
        }
    }
    let misi_cases: &[(u64, usize, usize)] = if b.quick {
        &[(100_000, 40, 2_000)]
    } else {
        &[(100_000_000, 1_000, 1_000_000), (1_000_000_000, 1_000, 1_000_000)]
    };
    for &(e, k, n) in misi_cases {
        if wanted(&format!("MISI zipf-10^{}-10^{}", e.ilog10(), n.ilog10())) {
            t.rows.push(misi(b, e, k, n)?);
        }
    }
    // From SQL: the size (k = 1,000 of 10^6 over 10^8: 10^9 elements) and a tenth of it.
    let sql_cases: &[(u64, usize, usize)] = if b.quick {
        &[(100_000, 40, 2_000)]
    } else {
        &[(10_000_000, 1_000, 100_000), (100_000_000, 1_000, 1_000_000)]
    };
    for &(e, k, n) in sql_cases {
        if wanted(&format!("MISI from SQL, zipf-10^{}-10^{}", e.ilog10(), n.ilog10())) {
            t.rows.push(misi_sql(b, e, k, n)?);
        }
    }
    t.rows.push(Row::not_run(
        "B5 MISI real: ENRON, ORKUT, TWITTER (largest 10,000 sets)",
        "sf-gssjoin best, ~147x the best CPU",
        "the datasets are not in ../shared/data and the GPU machine has no network",
    ));
    t.rows.push(Row::new(
        "B6 memory limits",
        "reject or tile BI-naive at E = 10^9 (k x 125 MB), IP diagonals at k = 10000, sf-gssjoin at E = 10^9",
        "bitmaps tile the universe into chunks that fit the budget (B4 at 10^9: 125 GB of bitmaps in chunks); \
         the inverted lists take 4 bytes an element (fit wherever the sets do); IP-OBS's diagonals (8 bytes a \
         tile of 4,096 merge steps: 195 GB at k = 10000 sets of 10^6) are built a batch of pairs at a time, as many \
         as half the free budget holds (unit test `gpu_search_tiles_when_memory_is_short`)",
    ));
    t.rows.push(Row::new(
        "B7 a larger GPU",
        "12 GB Titan XP",
        "every SISI pair above fits the device in one piece (2 x 10^7 uint32 = 80 MB)",
    ));
    Ok(t)
}

/// `k` sets of `n` distinct elements drawn from zipf over `universe`, as a
/// family (the sets are drawn on the host's threads).
fn zipf_family(universe: u64, k: usize, n: usize) -> Family {
    let mut sets: Vec<Vec<u32>> = vec![Vec::new(); k];
    setfusion::host::for_each_mut(&mut sets, &|i, set| *set = sorted_set(Dist::Zipf, universe, n, 1_000 + i as u64));
    let mut f = Family { offsets: Vec::with_capacity(k + 1), elements: Vec::with_capacity(k * n) };
    f.offsets.push(0);
    for set in &sets {
        f.elements.extend_from_slice(set);
        f.offsets.push(f.elements.len());
    }
    f
}

/// B4: MISI over `k` zipf sets: every pair's overlap count (pairs i < j) by
/// both device methods, the one `choose` picks, and the best single-threaded
/// CPU technique measured on a sample of pairs (the full all-pairs CPU run
/// takes hours at this size) scaled to every pair.
fn misi(b: &Bench, universe: u64, k: usize, n: usize) -> Result<Row> {
    let name = format!("zipf-10^{}-10^{}, k = {k}", universe.ilog10(), n.ilog10());
    let started = std::time::Instant::now();
    let f = zipf_family(universe, k, n);
    let made = started.elapsed().as_secs_f64();
    let from: Vec<u32> = (1..=k as u32).collect();
    let space = PairSpace { left: &f, right: &f, right_from: Some(&from) };
    let pairs = space.pair_count(0..k);
    // The single-threaded CPU techniques on sampled pairs.
    let mut rng = Rng::new(k as u64);
    let sample: Vec<(usize, usize)> = (0..200)
        .map(|_| {
            let i = rng.below(k as u64 - 1) as usize;
            (i, i + 1 + rng.below((k - 1 - i) as u64) as usize)
        })
        .collect();
    let (t_merge, merged) = b.time(false, || {
        Ok(sample.iter().map(|&(i, j)| intersect_count_cpu(f.set(i), f.set(j), None)).collect::<Vec<u64>>())
    })?;
    let (t_bitmap, probed) = b.time(false, || {
        // BI-dynamic on the host: set i's bitmap, set j's elements probed (the bitmap's build counted once per i).
        Ok(sample.iter().map(|&(i, j)| bitmap_count(f.set(i), f.set(j), universe)).collect::<Vec<u64>>())
    })?;
    let (t_simd, blocked) =
        b.time(false, || Ok(sample.iter().map(|&(i, j)| simd_count(f.set(i), f.set(j))).collect::<Vec<u64>>()))?;
    let per_pair = |t: f64| t / sample.len() as f64;
    let cpu = [("merge", per_pair(t_merge)), ("bitmap", per_pair(t_bitmap)), ("SIMD blocks", per_pair(t_simd))];
    let best = cpu.iter().copied().fold(("", f64::INFINITY), |m, c| if c.1 < m.1 { c } else { m });
    let mut answers =
        Answers::check(merged == probed && merged == blocked, || "CPU merge, bitmap and SIMD blocks differ".into());
    let mut ours = vec![format!(
        "{pairs} pairs; CPU (one thread, {} sampled pairs scaled): merge {}, bitmap {}, SIMD blocks {}",
        sample.len(),
        ms(cpu[0].1 * pairs as f64),
        ms(cpu[1].1 * pairs as f64),
        ms(cpu[2].1 * pairs as f64)
    )];
    let mut ratio = "-".to_string();
    if let Some(gpu) = &b.gpu {
        let inv = OnceLock::new();
        let t0 = std::time::Instant::now();
        let chosen = overlap::choose(&space, 0..k, false);
        let t_choose = t0.elapsed().as_secs_f64() * 1e3;
        let est = overlap::estimate_seconds(&space, 0..k, false);
        ours.push(format!(
            "estimated: {:.3e} increments, {:.3e} word pairs, {:.3e} merge steps; inverted lists {:.2} s (indexing \
             included), bitmaps {:.2} s, partitioned search {:.2} s",
            overlap::estimate_increments(&space, 0..k) as f64,
            pairs as f64 * (f.domain().div_ceil(32)) as f64,
            overlap::merged_elements(&space, 0..k) as f64,
            est.inverted_lists,
            est.bitmaps,
            est.partitioned_search
        ));
        let mut results = Vec::new();
        let mut t_index = 0.0;
        for method in [OverlapMethod::Bitmaps, OverlapMethod::PartitionedSearch, OverlapMethod::InvertedLists] {
            if method == OverlapMethod::InvertedLists {
                let t0 = std::time::Instant::now();
                inv.get_or_init(|| InvertedLists::of_space(&space));
                t_index = t0.elapsed().as_secs_f64() * 1e3;
                ours.push(format!("inverted lists built on the host in {}", ms(t_index)));
            }
            let (t, (counts, _)) = b.time(true, || {
                overlap::counts_gpu(&gpu.lease(0), &space, &inv, 0..k, Some(method), &mut TransferStats::default())
            })?;
            ours.push(format!("GPU {} {}", method.name(), ms(t)));
            results.push((method, t, counts));
        }
        let same = results.iter().all(|r| r.2 == results[0].2);
        let sampled_ok = sample.iter().zip(&merged).all(|(&(i, j), &m)| results[0].2[i * k + j] as u64 == m);
        answers = answers.and(Answers::check(same && sampled_ok, || "GPU methods or sampled pairs differ".into()));
        // The chosen method's time, with the choice and (inverted lists) the host's indexing.
        let t_chosen = results.iter().find(|r| r.0 == chosen).map_or(f64::NAN, |r| r.1)
            + t_choose
            + if chosen == OverlapMethod::InvertedLists { t_index } else { 0.0 };
        ours.push(format!("chosen: {} ({} to choose; {} in all)", chosen.name(), ms(t_choose), ms(t_chosen)));
        let time_of = |m: OverlapMethod| results.iter().find(|r| r.0 == m).map_or(f64::NAN, |r| r.1);
        ours.push(format!(
            "IP-OBS {} the bitmaps (BI)",
            times(time_of(OverlapMethod::PartitionedSearch), time_of(OverlapMethod::Bitmaps))
        ));
        ratio = format!(
            "{} the best CPU ({}, one thread) by the chosen method",
            times(best.1 * pairs as f64, t_chosen),
            best.0
        );
    }
    if b.quick {
        // The CPU twins over every pair: the inverted lists', and the partitioned search's tiles.
        let inv = InvertedLists::of_space(&space);
        let all = overlap::counts_cpu(&space, &inv, 0..k);
        let ok = sample.iter().zip(&merged).all(|(&(i, j), &m)| all[i * k + j] as u64 == m);
        answers = answers.and(Answers::check(ok, || "the CPU twin differs from the merge".into()));
        let searched = overlap::search_counts_cpu(&space, 0..k, overlap::SEARCH_TILE);
        answers = answers.and(Answers::check(searched == all, || "the partitioned search's twin differs".into()));
    }
    ours.push(format!("(sets drawn in {made:.1} s)"));
    Ok(Row::new(
        format!("B4 MISI {name}"),
        "BI-dynamic best, ~35x the best CPU; sf-gssjoin second (out of memory at 10^9); IP-OBS ~80% faster than OBS; \
         seconds to thousands of seconds",
        ours.join("; "),
    )
    .ratio(ratio)
    .answers(answers))
}

/// B4 from SQL: `intersect_families('s', 'counts')` over a table of `k` zipf
/// sets (one row a set, BIGINT lists), on the GPU and the CPU backend. At
/// 10^9 elements each engine runs once after its warm-up (the CPU backend
/// without one): a query there takes seconds to minutes.
fn misi_sql(b: &Bench, universe: u64, k: usize, n: usize) -> Result<Row> {
    let large = k * n >= 500_000_000;
    use datafusion::arrow::array::{Array, Int64Array, ListArray, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    let f = zipf_family(universe, k, n);
    // The list column straight from the family's arrays (10^9 elements: an
    // element-by-element builder took a minute of the device's time): the
    // ids widened on the host's threads, whose u64 bits are their BIGINTs.
    let values = datafusion::arrow::buffer::ScalarBuffer::<i64>::new(
        datafusion::arrow::buffer::Buffer::from_vec(widen(&f.elements)),
        0,
        f.elements.len(),
    );
    let lists = ListArray::try_new(
        std::sync::Arc::new(Field::new_list_field(DataType::Int64, true)),
        datafusion::arrow::buffer::OffsetBuffer::from_lengths(f.offsets.windows(2).map(|w| w[1] - w[0])),
        std::sync::Arc::new(Int64Array::new(values, None)),
        None,
    )?;
    let schema = std::sync::Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("elements", lists.data_type().clone(), true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![std::sync::Arc::new(Int64Array::from_iter_values(0..k as i64)), std::sync::Arc::new(lists)],
    )?;
    let query = "SELECT count(*), sum(overlap) FROM intersect_families('s', 'counts')";
    let run = |setting: &'static str, warm_up: bool| -> Result<(f64, String)> {
        block_on(async {
            let ctx = setfusion::context();
            let table = datafusion::datasource::MemTable::try_new(schema.clone(), vec![vec![batch.clone()]])?;
            ctx.register_table("s", std::sync::Arc::new(table))?;
            ctx.sql(setting).await?.collect().await?;
            if warm_up && !b.quick {
                ctx.sql(query).await?.collect().await?;
            }
            let mut times = Vec::new();
            let mut answer = String::new();
            for _ in 0..if large { 1 } else { b.runs.max(1) } {
                let t = std::time::Instant::now();
                let out = ctx.sql(query).await?.collect().await?;
                times.push(t.elapsed());
                answer = datafusion::arrow::util::pretty::pretty_format_batches(&out)?.to_string();
            }
            Ok((crate::bench::median(times).as_secs_f64() * 1e3, answer))
        })
    };
    let (t_cpu, a_cpu) = run("SET setfusion.strategy = 'cpu'", !large)?;
    let mut ours = format!("CPU backend (all host threads) {}", ms(t_cpu));
    let mut answers = Answers::Unchecked;
    let mut ratio = "-".to_string();
    if b.gpu.is_some() {
        let (t_gpu, a_gpu) = run("SET setfusion.min_rows = 0", true)?;
        ours = format!("GPU {}; {ours}", ms(t_gpu));
        answers = Answers::check(a_gpu == a_cpu, || "GPU and CPU answers differ".into());
        ratio = format!("{} the CPU backend", times(t_cpu, t_gpu));
    }
    Ok(Row::new(
        format!("B4 MISI from SQL, zipf-10^{}-10^{}, k = {k}", universe.ilog10(), n.ilog10()),
        "no figure (the paper times kernels, not queries)",
        format!("`{query}`: {ours}"),
    )
    .ratio(ratio)
    .answers(answers))
}

/// The count of `a ∩ b` on the device by the sorted (merge path) kernel.
fn gpu_sorted_count(gpu: &Gpu, a: &[u32], b: &[u32]) -> Result<u64> {
    let mut stats = TransferStats::default();
    SortedIntersect::upload(gpu, a, b, &mut stats)?.run(gpu, None, &mut stats)
}

/// The count of `a ∩ b` (one set a family) on the device by the overlap
/// counts' partitioned search (IP-OBS), as `intersect_families` runs it.
fn gpu_search_count(gpu: &Gpu, a: &Family, b: &Family) -> Result<u64> {
    let space = PairSpace { left: a, right: b, right_from: None };
    let (counts, _) = overlap::counts_gpu(
        gpu,
        &space,
        &OnceLock::new(),
        0..1,
        Some(OverlapMethod::PartitionedSearch),
        &mut TransferStats::default(),
    )?;
    Ok(counts[0] as u64)
}

/// The count of `a ∩ b` on the device by the hash selection (keys widened to u64).
fn gpu_hash_count(gpu: &Gpu, a: &[u32], b: &[u32]) -> Result<u64> {
    let (wa, wb) = (widen(a), widen(b));
    Ok(select_gpu(gpu, GpuStrategy::Hash, SetOp::Semi, &wa, &wb, &mut TransferStats::default())?.count_set_bits()
        as u64)
}

/// The SIMD intersection baseline (Lemire et al.'s block comparison of sorted
/// unique integers) as safe Rust the compiler vectorizes: a block of 8 of `a`
/// against a block of 8 of `b`, all 64 pairs compared at once, then the block
/// with the smaller last element advanced (both when equal); what is left
/// after the last whole blocks is merged. Every match involving an element
/// before either cursor has been counted, so the tails' matches are the rest.
pub fn simd_count(a: &[u32], b: &[u32]) -> u64 {
    const W: usize = 8;
    let (mut i, mut j, mut count) = (0usize, 0usize, 0u64);
    while i + W <= a.len() && j + W <= b.len() {
        let (x, y) = (&a[i..i + W], &b[j..j + W]);
        let mut hits = 0u32;
        for &v in x {
            for &w in y {
                hits += (v == w) as u32;
            }
        }
        count += hits as u64;
        let (xl, yl) = (x[W - 1], y[W - 1]);
        i += if xl <= yl { W } else { 0 };
        j += if yl <= xl { W } else { 0 };
    }
    count + intersect_count_cpu(&a[i..], &b[j..], None)
}

/// boost::dynamic_bitset used as BI-dynamic: a's bits over the universe, b's elements tested.
fn bitmap_count(a: &[u32], b: &[u32], universe: u64) -> u64 {
    let mut bits = vec![0u64; universe.div_ceil(64) as usize];
    for &x in a {
        bits[(x / 64) as usize] |= 1 << (x % 64);
    }
    b.iter().filter(|&&x| bits[(x / 64) as usize] >> (x % 64) & 1 == 1).count() as u64
}

/// `SELECT cardinality(sorted_intersect(a, b)) FROM t` over one row of two
/// BIGINT lists, on the GPU or (`cpu`) the CPU backend: the median time of
/// the query (planning included) and its answer.
fn sql_sorted_intersect(b: &Bench, a: &[u32], bb: &[u32], cpu: bool) -> Result<(f64, u64)> {
    use datafusion::arrow::array::{Array, ListArray, RecordBatch};
    use datafusion::arrow::datatypes::{Field, Int64Type, Schema};
    let list = |v: &[u32]| ListArray::from_iter_primitive::<Int64Type, _, _>([Some(v.iter().map(|&x| Some(x as i64)))]);
    let (la, lb) = (list(a), list(bb));
    let schema = std::sync::Arc::new(Schema::new(vec![
        Field::new("a", la.data_type().clone(), true),
        Field::new("b", lb.data_type().clone(), true),
    ]));
    let batch = RecordBatch::try_new(schema.clone(), vec![std::sync::Arc::new(la), std::sync::Arc::new(lb)])?;
    block_on(async {
        let ctx = setfusion::context();
        ctx.register_table(
            "t",
            std::sync::Arc::new(datafusion::datasource::MemTable::try_new(schema, vec![vec![batch]])?),
        )?;
        let setting = if cpu { "SET setfusion.strategy = 'cpu'" } else { "SET setfusion.min_rows = 0" };
        ctx.sql(setting).await?.collect().await?;
        let query = "SELECT cardinality(sorted_intersect(a, b)) FROM t";
        if !cpu && !b.quick {
            ctx.sql(query).await?.collect().await?;
        }
        let mut times = Vec::new();
        let mut answer = 0;
        for _ in 0..b.runs.max(1) {
            let t = std::time::Instant::now();
            let out = ctx.sql(query).await?.collect().await?;
            times.push(t.elapsed());
            answer = out[0]
                .column(0)
                .as_any()
                .downcast_ref::<datafusion::arrow::array::UInt64Array>()
                .map_or(u64::MAX, |c| c.value(0));
        }
        Ok((crate::bench::median(times).as_secs_f64() * 1e3, answer))
    })
}

/// One SISI dataset, `dist`-E-n.
fn sisi(b: &Bench, dist: Dist, universe: u64, n: usize) -> Result<Row> {
    let name = format!("{}-10^{}-10^{}", dist.name(), universe.ilog10(), n.ilog10());
    let a = sorted_set(dist, universe, n, universe ^ n as u64);
    let bb = sorted_set(dist, universe, n, (universe ^ n as u64).wrapping_mul(3) + 1);
    let (t_merge, want) = b.time(false, || Ok(intersect_count_cpu(&a, &bb, None)))?;
    let (t_gallop, gallop) =
        b.time(false, || Ok(sorted_intersect_with(IntersectMethod::Gallop, &a, &bb).len() as u64))?;
    let (t_bitmap, bitmap) = b.time(false, || Ok(bitmap_count(&a, &bb, universe)))?;
    let (t_simd, simd) = b.time(false, || Ok(simd_count(&a, &bb)))?;
    let mut answers = Answers::check(gallop == want && bitmap == want && simd == want, || {
        format!("CPU: {want} / {gallop} / {bitmap} / {simd}")
    });
    let cpu = [("merge", t_merge), ("galloping", t_gallop), ("bitmap", t_bitmap), ("SIMD blocks", t_simd)];
    let best = cpu.iter().copied().fold(("", f64::INFINITY), |m, c| if c.1 < m.1 { c } else { m });
    let mut ours = format!(
        "A ∩ B: {want} elements; CPU merge {}, galloping {}, bitmap {}, SIMD blocks {}",
        ms(t_merge),
        ms(t_gallop),
        ms(t_bitmap),
        ms(t_simd)
    );
    let mut ratio = "-".to_string();
    if let Some(r) = b.on_gpu(|g| {
        let sorted = b.time(true, || gpu_sorted_count(g, &a, &bb))?;
        let hash = b.time(true, || gpu_hash_count(g, &a, &bb))?;
        let (fa, fb) = (Family::from_sets(&[&a]), Family::from_sets(&[&bb]));
        let search = b.time(true, || gpu_search_count(g, &fa, &fb))?;
        Ok((sorted, hash, search))
    }) {
        let ((t_sorted, c_sorted), (t_hash, c_hash), (t_search, c_search)) = r?;
        ours = format!(
            "GPU sorted (IP) {}, IP-OBS {} ({} IP), hash {}; {ours}",
            ms(t_sorted),
            ms(t_search),
            times(t_sorted, t_search),
            ms(t_hash)
        );
        answers = answers.and(Answers::check(c_sorted == want && c_hash == want && c_search == want, || {
            format!("GPU sorted {c_sorted}, hash {c_hash}, IP-OBS {c_search}, CPU {want}")
        }));
        ratio = format!("{} the best CPU ({})", times(best.1, t_sorted.min(t_hash)), best.0);
        if let Some(r) = b.with_cuda(|h| h.set_op("intersection", true, &a, &bb)) {
            let (count, t) = r?;
            ours += &format!("; thrust {}", t.show());
            answers = answers.and(Answers::check(count == want, || format!("thrust {count}, CPU {want}")));
            ratio += &format!("; {} thrust", times(t.total_ms, t_sorted.min(t_hash)));
        }
    }
    // The same pair from SQL: one row of two lists, `sorted_intersect` (GTWJ on the device).
    let (t_sql_cpu, c_sql_cpu) = sql_sorted_intersect(b, &a, &bb, true)?;
    answers = answers.and(Answers::check(c_sql_cpu == want, || format!("SQL on the CPU: {c_sql_cpu}")));
    ours += &format!("; from SQL (`sorted_intersect`): CPU {}", ms(t_sql_cpu));
    if b.gpu.is_some() {
        let (t_sql, c_sql) = sql_sorted_intersect(b, &a, &bb, false)?;
        answers = answers.and(Answers::check(c_sql == want, || format!("SQL on the GPU: {c_sql}")));
        ours += &format!(", GPU {}", ms(t_sql));
    }
    Ok(Row::new(
        format!("B3 SISI {name}"),
        "IP / IP-OBS best: ~2.3x the best CPU on average, up to 2.92x; all times 0-100 ms",
        ours,
    )
    .ratio(ratio)
    .answers(answers))
}
