//! Set-similarity join (issue 4): both backends against exact references on
//! random collections and on the DBLP titles, and the SQL operator's plan.
//! GPU parts are skipped (with the reason printed) when no GPU is usable,
//! unless SETFUSION_REQUIRE_GPU=1.

use std::collections::HashMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use setfusion::algo::ssjoin::{
    ssjoin_brute_force, ssjoin_cpu, ssjoin_exact_counter, ssjoin_gpu, JoinStats, Metric, Pair, RawSets, SetCollection,
    Threshold,
};
use setfusion::algo::ssjoin_prep::preprocess;

use crate::common::{block_on, require_gpu};

fn gpu() -> Option<Arc<setfusion::gpu::Gpu>> {
    match setfusion::gpu::gpu(0) {
        Ok(g) => Some(g),
        Err(e) if require_gpu() => panic!("SETFUSION_REQUIRE_GPU=1 but no usable GPU: {e}"),
        Err(e) => {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "skipping gpu backend: {e}");
            None
        }
    }
}

fn sorted(mut v: Vec<Pair>) -> Vec<Pair> {
    v.sort_unstable();
    v
}

fn uniform(rng: &mut StdRng, n: usize, universe: u64, lo: usize, hi: usize) -> RawSets {
    let mut r = RawSets::new();
    for _ in 0..n {
        let k = rng.random_range(lo..=hi);
        r.push((0..k).map(|_| rng.random_range(0..universe)).collect::<Vec<_>>());
    }
    r
}

fn zipf(rng: &mut StdRng, n: usize, universe: usize, lo: usize, hi: usize) -> RawSets {
    let cdf: Vec<f64> = (1..=universe)
        .scan(0.0, |a, i| {
            *a += 1.0 / i as f64;
            Some(*a)
        })
        .collect();
    let total = *cdf.last().unwrap();
    let mut r = RawSets::new();
    for _ in 0..n {
        let k = rng.random_range(lo..=hi);
        r.push((0..k).map(|_| cdf.partition_point(|&c| c < rng.random::<f64>() * total) as u64).collect::<Vec<_>>());
    }
    r
}

/// Run CPU (and GPU when present) and compare with `want`.
fn check(
    name: &str,
    r: &SetCollection,
    s: Option<&SetCollection>,
    thr: Threshold,
    want: &[Pair],
    g: Option<&setfusion::gpu::Gpu>,
) {
    assert_eq!(sorted(ssjoin_cpu(r, s, thr)), want, "{name}: cpu backend, {thr:?}");
    if let Some(g) = g {
        let _lock = g.lock_blocking();
        let mut st = JoinStats::default();
        let got = ssjoin_gpu(g, r, s, thr, &mut st).unwrap_or_else(|e| panic!("{name}: gpu failed: {e}"));
        assert_eq!(sorted(got), want, "{name}: gpu backend, {thr:?}");
    }
}

#[test]
fn differential_random_collections() {
    let _device = crate::common::shared_device();
    let g = gpu();
    let mut rng = StdRng::seed_from_u64(42);
    let cases = [
        ("uniform", uniform(&mut rng, 1500, 300, 0, 25), uniform(&mut rng, 1000, 300, 1, 25)),
        ("zipf", zipf(&mut rng, 1500, 2000, 0, 40), zipf(&mut rng, 1200, 2000, 5, 40)),
    ];
    for (name, a, b) in &cases {
        let (rs, _) = preprocess(a, None);
        let (r, s) = preprocess(a, Some(b));
        let s = s.unwrap();
        let mut thresholds = vec![];
        for m in [Metric::Jaccard, Metric::Dice, Metric::Cosine] {
            for t in [0.2, 0.5, 0.7, 0.9] {
                thresholds.push(Threshold::new(m, t));
            }
        }
        thresholds.push(Threshold::strict(Metric::Jaccard, 0.5));
        thresholds.push(Threshold::new(Metric::Overlap, 1.0));
        thresholds.push(Threshold::new(Metric::Overlap, 4.0));
        for thr in thresholds {
            let want = sorted(ssjoin_brute_force(&rs, None, thr));
            check(&format!("{name} self"), &rs, None, thr, &want, g.as_deref());
            let want = sorted(ssjoin_brute_force(&r, Some(&s), thr));
            check(&format!("{name} r-s"), &r, Some(&s), thr, &want, g.as_deref());
        }
    }
    // GPU streaming under a small memory limit: many probe blocks.
    if let Some(g) = g {
        let (r, _) = preprocess(&cases[1].1, None);
        let thr = Threshold::new(Metric::Jaccard, 0.3);
        let want = sorted(ssjoin_brute_force(&r, None, thr));
        let _lock = g.lock_blocking();
        g.budget().set_limit(2 << 20);
        let mut st = JoinStats::default();
        let got = ssjoin_gpu(&g, &r, None, thr, &mut st);
        g.budget().set_limit(0);
        assert_eq!(sorted(got.unwrap()), want, "gpu under a 2 MiB budget");
        // The fused kernel streams within the budget; how many launches that takes
        // depends on the output buffer it could afford, so only exactness is asserted.
        println!("gpu under a 2 MiB budget: {} launches", st.blocks);
        assert!(st.blocks >= 1);
    }
}

/// DBLP titles (with typos), 3-gram sets, self join at 0.5 / 0.7 / 0.9.
#[test]
fn dblp_3gram_self_join() {
    let _device = crate::common::shared_device();
    let Some(text) = crate::common::data_file("dblp_t_18k.txt") else { return };
    let mut dict: HashMap<String, u64> = HashMap::new();
    let mut raw = RawSets::new();
    for line in text.lines() {
        let title = line.split_once('#').map(|(_, t)| t).unwrap_or(line);
        let grams = setfusion::udf::qgram_tokens(&title.to_lowercase(), 3);
        let n = dict.len();
        let keys: Vec<u64> = grams
            .into_iter()
            .map(|g| {
                let n2 = dict.len() as u64;
                *dict.entry(g).or_insert(n2)
            })
            .collect();
        let _ = n;
        raw.push(keys);
    }
    assert_eq!(raw.len(), 18000);
    let (c, _) = preprocess(&raw, None);
    let g = gpu();
    // The exact reference once at the lowest threshold; higher thresholds
    // re-apply the predicate to its (overlap, sizes).
    let start = std::time::Instant::now();
    let base = sorted(ssjoin_exact_counter(&c, None, Threshold::new(Metric::Jaccard, 0.5)));
    let t_ref = start.elapsed();
    let mut size_of = vec![0u32; c.len()];
    for p in 0..c.len() {
        size_of[c.ids[p] as usize] = c.size(p);
    }
    for t in [0.5, 0.7, 0.9] {
        let thr = Threshold::new(Metric::Jaccard, t);
        let want: Vec<Pair> =
            base.iter().copied().filter(|&(a, b, o)| thr.passes(o, size_of[a as usize], size_of[b as usize])).collect();
        let start = std::time::Instant::now();
        let mut st = JoinStats::default();
        let cpu = sorted(setfusion::algo::ssjoin::ssjoin_cpu_with(
            &c,
            None,
            thr,
            setfusion::algo::ssjoin::default_threads(),
            &mut st,
        ));
        let t_cpu = start.elapsed();
        assert_eq!(cpu, want, "dblp cpu t={t}");
        let mut line = format!(
            "dblp 3-grams jaccard >= {t}: {} pairs; reference (at 0.5) {t_ref:.2?}, cpu {t_cpu:.2?} ({} candidates)",
            want.len(),
            st.candidates
        );
        if let Some(g) = &g {
            let _lock = g.lock_blocking();
            let start = std::time::Instant::now();
            let mut st = JoinStats::default();
            let got = sorted(ssjoin_gpu(g, &c, None, thr, &mut st).unwrap());
            line += &format!(", gpu {:.2?} ({} candidates, {} blocks)", start.elapsed(), st.candidates, st.blocks);
            assert_eq!(got, want, "dblp gpu t={t}");
        }
        println!("{line}");
        assert!(!want.is_empty());
    }
}

async fn sql_rows(ctx: &datafusion::prelude::SessionContext, sql: &str) -> Vec<String> {
    let batches = ctx.sql(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}")).collect().await.unwrap();
    let text = datafusion::arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string();
    text.lines().map(|l| l.to_string()).collect()
}

/// A table `(id BIGINT NOT NULL, elements LIST<BIGINT>)`, ids 0.. in row order.
fn id_sets_table(sets: Vec<Option<Vec<Option<i64>>>>) -> datafusion::arrow::record_batch::RecordBatch {
    use datafusion::arrow::array::{Int64Array, ListArray};
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("elements", DataType::List(Arc::new(Field::new_list_field(DataType::Int64, true))), true),
    ]));
    let n = sets.len() as i64;
    datafusion::arrow::record_batch::RecordBatch::try_new(
        schema,
        vec![
            Arc::new(Int64Array::from_iter_values(0..n)),
            Arc::new(ListArray::from_iter_primitive::<Int64Type, _, _>(sets)),
        ],
    )
    .unwrap()
}

/// `batch` as the one Parquet file at `path` (the writer's defaults: one row group up to 1M rows).
fn write_parquet(path: &std::path::Path, batch: &datafusion::arrow::record_batch::RecordBatch) {
    let file = std::fs::File::create(path).unwrap();
    let mut w = datafusion::parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

/// A setfusion session that plans similarity joins at any size: on the GPU
/// when one is present, else on the CPU backend (named, so EXPLAIN says so).
async fn similarity_session(use_gpu: bool) -> datafusion::prelude::SessionContext {
    let ctx = setfusion::context();
    ctx.sql("SET setfusion.min_rows = 0").await.unwrap().collect().await.unwrap();
    if !use_gpu {
        ctx.sql("SET setfusion.strategy = 'cpu'").await.unwrap().collect().await.unwrap();
    }
    ctx
}

/// The SQL operator: plan shape, EXPLAIN ANALYZE metrics, results vs the
/// nested-loop plan with setfusion disabled.
#[test]
fn sql_similarity_join_plan_and_results() {
    let _device = crate::common::shared_device();
    let use_gpu = gpu().is_some();
    block_on(move || async move {
        let ctx = similarity_session(use_gpu).await;
        // 400 random integer sets.
        let mut rng = StdRng::seed_from_u64(7);
        let rows: Vec<String> = (0..400)
            .map(|i| {
                let k = rng.random_range(1..12);
                let v: Vec<String> = (0..k).map(|_| rng.random_range(0..40).to_string()).collect();
                format!("({i}, [{}])", v.join(", "))
            })
            .collect();
        ctx.sql(&format!("CREATE TABLE t(id INT, s INT[]) AS VALUES {}", rows.join(", ")))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let q = "SELECT a.id, b.id FROM t a JOIN t b ON a.id < b.id AND jaccard(a.s, b.s) >= 0.4 ORDER BY 1, 2";
        let plan = sql_rows(&ctx, &format!("EXPLAIN {q}")).await.join("\n");
        assert!(plan.contains("SimilarityJoinExec: metric=jaccard"), "{plan}");
        assert!(plan.contains("threshold >= 0.4"), "{plan}");
        assert!(
            plan.contains(if use_gpu { "backend=gpu" } else { "backend=cpu, reason=\"setfusion.strategy = cpu\"" }),
            "{plan}"
        );
        let analyzed = sql_rows(&ctx, &format!("EXPLAIN ANALYZE {q}")).await.join("\n");
        for m in ["candidates=", "verified_pairs=", "bytes_to_device=", "kernel_time="] {
            assert!(analyzed.contains(m), "{m} missing in\n{analyzed}");
        }
        // Both sides read one table (one of them repartitioned): one read, a self join.
        assert!(analyzed.contains("self join"), "{analyzed}");
        let got = sql_rows(&ctx, q).await;
        // With the diagonal (a row with itself passes `<=`) and without it (`<>` rejects it).
        let q_le = q.replace("a.id < b.id", "a.id <= b.id");
        let q_ne = q.replace("a.id < b.id", "a.id <> b.id");
        let (got_le, got_ne) = (sql_rows(&ctx, &q_le).await, sql_rows(&ctx, &q_ne).await);
        ctx.sql("SET setfusion.enabled = false").await.unwrap().collect().await.unwrap();
        let plain_plan = sql_rows(&ctx, &format!("EXPLAIN {q}")).await.join("\n");
        assert!(!plain_plan.contains("SimilarityJoinExec"), "{plain_plan}");
        let want = sql_rows(&ctx, q).await;
        assert_eq!(got, want);
        assert_eq!(got_le, sql_rows(&ctx, &q_le).await);
        assert_eq!(got_ne, sql_rows(&ctx, &q_ne).await);
        assert_eq!(got_le.len(), got.len() + 400, "the diagonal (400 sets with themselves) must be there for <=");
        assert!(got.len() > 4, "expected some pairs");
    });
}

/// Every similarity predicate answers as DataFusion's own plan (setfusion
/// disabled), over NULL lists, empty lists, NULL and repeated elements, ints
/// and strings: thresholds at the metric's ends and past them, strict and
/// not, `overlap` compared with fractions, NaN, casts of the metric. Those
/// the operator decides run in a `SimilarityJoinExec`; the others (every pair
/// passes, or a cast rounds the metric) keep DataFusion's join under a
/// `SetfusionDeclinedExec` that says why.
#[test]
fn sql_similarity_predicates_answer_as_datafusion() {
    let _device = crate::common::shared_device();
    let use_gpu = gpu().is_some();
    block_on(move || async move {
        let ctx = similarity_session(use_gpu).await;
        let mut rng = StdRng::seed_from_u64(31);
        let rows: Vec<String> = (0..160)
            .map(|i| {
                let list = |rng: &mut StdRng, strings: bool| match rng.random_range(0..12) {
                    0 => "NULL".to_string(),
                    1 => "[]".to_string(),
                    _ => {
                        let k = rng.random_range(1..7);
                        let v: Vec<String> = (0..k)
                            .map(|_| match rng.random_range(0..14) {
                                0 => "NULL".to_string(),
                                e if strings => format!("'w{}'", e % 9),
                                e => (e % 9).to_string(),
                            })
                            .collect();
                        format!("[{}]", v.join(", "))
                    }
                };
                format!("({i}, {}, {})", list(&mut rng, false), list(&mut rng, true))
            })
            .collect();
        ctx.sql(&format!("CREATE TABLE t(id INT, s INT[], w VARCHAR[]) AS VALUES {}", rows.join(", ")))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        // (predicate, decided by the operator)
        let cases = [
            ("jaccard(a.s, b.s) >= 0.5", true),
            ("jaccard(a.s, b.s) > 0.5", true),
            ("jaccard(a.s, b.s) > 0", true),
            // -0.0 is 0.0 to DataFusion's comparison: sharing an element.
            ("dice(a.s, b.s) > CAST('-0.0' AS DOUBLE)", true),
            ("dice(a.s, b.s) >= CAST('-0.0' AS DOUBLE)", false),
            ("jaccard(a.s, b.s) >= 1", true),
            ("jaccard(a.s, b.s) > 1", true),
            ("jaccard(a.s, b.s) >= 2", true),
            ("jaccard(a.s, b.s) >= CAST('NaN' AS DOUBLE)", true),
            ("0.4 <= dice(b.s, a.s)", true),
            ("0.25 < set_cosine(a.w, b.w)", true),
            ("jaccard(a.w, b.w) >= 0.3", true),
            ("overlap(a.s, b.s) > 0", true),
            ("overlap(a.s, b.s) >= 0.5", true),
            ("overlap(a.s, b.s) > 1.5", true),
            ("overlap(a.s, b.s) >= 3", true),
            ("CAST(overlap(a.w, b.w) AS DOUBLE) >= 2", true),
            ("jaccard(a.s, b.s) >= 0", false),
            ("jaccard(a.s, b.s) > -0.5", false),
            ("overlap(a.s, b.s) >= 0", false),
            ("overlap(a.s, b.s) > -1", false),
            ("CAST(jaccard(a.s, b.s) AS INT) >= 0.5", false),
            ("CAST(jaccard(a.s, b.s) AS DECIMAL(3, 1)) >= 0.5", false),
            ("CAST(jaccard(a.s, b.s) AS REAL) >= 0.4", false),
        ];
        let mut got = Vec::new();
        for (p, decided) in cases {
            let q = format!("SELECT a.id, b.id FROM t a JOIN t b ON a.id < b.id AND {p} ORDER BY 1, 2");
            let plan = sql_rows(&ctx, &format!("EXPLAIN {q}")).await.join("\n");
            assert_eq!(plan.contains("SimilarityJoinExec"), decided, "{p}\n{plan}");
            assert_eq!(plan.contains("SetfusionDeclinedExec"), !decided, "{p}\n{plan}");
            got.push(sql_rows(&ctx, &q).await);
        }
        ctx.sql("SET setfusion.enabled = false").await.unwrap().collect().await.unwrap();
        for ((p, _), got) in cases.iter().zip(got) {
            let q = format!("SELECT a.id, b.id FROM t a JOIN t b ON a.id < b.id AND {p} ORDER BY 1, 2");
            assert_eq!(got, sql_rows(&ctx, &q).await, "{p}");
        }
    });
}

/// A hash join with a similarity conjunct (equality or IS NOT DISTINCT FROM
/// keys + jaccard) becomes a SimilarityJoinExec whose residual filter applies
/// the keys; the answer is DataFusion's own (setfusion disabled).
#[test]
fn sql_similarity_join_with_equality_keys() {
    let _device = crate::common::shared_device();
    let use_gpu = gpu().is_some();
    block_on(move || async move {
        let ctx = similarity_session(use_gpu).await;
        let mut rng = StdRng::seed_from_u64(17);
        let rows: Vec<String> = (0..300)
            .map(|i| {
                let k = rng.random_range(0..10);
                let v: Vec<String> = (0..k).map(|_| rng.random_range(0..30).to_string()).collect();
                let cat = match rng.random_range(0..4) {
                    0 => "NULL".to_string(),
                    c => format!("'c{c}'"),
                };
                format!("({i}, {cat}, {}, [{}])", rng.random_range(0..3), v.join(", "))
            })
            .collect();
        ctx.sql(&format!("CREATE TABLE t(id INT, cat VARCHAR, g INT, s INT[]) AS VALUES {}", rows.join(", ")))
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let queries = [
            "SELECT a.id, b.id FROM t a JOIN t b ON a.cat = b.cat AND jaccard(a.s, b.s) >= 0.4 AND a.id < b.id ORDER BY 1, 2",
            "SELECT a.id, b.id FROM t a JOIN t b ON a.cat = b.cat AND a.g = b.g AND dice(a.s, b.s) > 0.5 ORDER BY 1, 2",
            "SELECT a.id, b.id, a.cat FROM t a JOIN t b ON a.cat = b.cat AND overlap(a.s, b.s) >= 2 ORDER BY 1, 2",
            "SELECT count(*) FROM t a JOIN t b ON a.g + 1 = b.g AND jaccard(a.s, b.s) >= 0.3",
            // NULL-equal keys (NULL categories pair up); parenthesised because DataFusion's
            // parser binds IS NOT DISTINCT FROM looser than AND.
            "SELECT a.id, b.id FROM t a JOIN t b ON (a.cat IS NOT DISTINCT FROM b.cat) AND jaccard(a.s, b.s) >= 0.4 AND a.id < b.id ORDER BY 1, 2",
        ];
        let mut got = Vec::new();
        for q in queries {
            let plan = sql_rows(&ctx, &format!("EXPLAIN {q}")).await.join("\n");
            if !plan.contains("SimilarityJoinExec") {
                panic!("no SimilarityJoinExec for {q}:\n{plan}");
            }
            assert!(!plan.contains("HashJoinExec"), "{q}\n{plan}");
            got.push(sql_rows(&ctx, q).await);
        }
        ctx.sql("SET setfusion.enabled = false").await.unwrap().collect().await.unwrap();
        for (q, got) in queries.iter().zip(got) {
            let plain = sql_rows(&ctx, &format!("EXPLAIN {q}")).await.join("\n");
            assert!(plain.contains("HashJoinExec"), "{q}\n{plain}");
            let want = sql_rows(&ctx, q).await;
            assert_eq!(got, want, "{q}");
            assert!(want.len() > 4, "{q}: expected some rows");
        }
    });
}

/// A Parquet file of one large row group under a similarity join or
/// `intersect_families` is read by ranges of rows, one partition each
/// (EXPLAIN lists the file once per range); the answer is the in-memory
/// table's and that of DataFusion's file groups (`scan_ranges = false`), for
/// a self join (read once), a join of the file with itself filtered, and a
/// families call (its input coalesced over the ranges).
#[test]
fn a_large_parquet_row_group_is_read_by_ranges() {
    let _device = crate::common::shared_device();
    let use_gpu = gpu().is_some();
    block_on(move || async move {
        let ctx = similarity_session(use_gpu).await;
        ctx.sql("SET datafusion.execution.target_partitions = 4").await.unwrap().collect().await.unwrap();
        let mut rng = StdRng::seed_from_u64(11);
        let n = 40_000;
        let sets: Vec<Option<Vec<Option<i64>>>> = (0..n)
            .map(|i| match i % 997 {
                0 => None,
                1 => Some(vec![]),
                _ => {
                    let k = rng.random_range(1..9);
                    Some((0..k).map(|_| Some(rng.random_range(0..300i64))).collect())
                }
            })
            .collect();
        let batch = id_sets_table(sets);
        let dir = std::env::temp_dir().join(format!("setfusion-ssjoin-ranges-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sets.parquet");
        write_parquet(&path, &batch);
        ctx.register_parquet("p", path.to_str().unwrap(), Default::default()).await.unwrap();
        ctx.register_batch("q", batch.slice(0, 30)).unwrap();
        ctx.register_batch("m", batch).unwrap();
        for (i, q) in [
            "SELECT count(*), sum(a.id + b.id) FROM p a JOIN p b ON a.id < b.id AND jaccard(a.elements, b.elements) >= 0.6",
            "SELECT count(*), sum(a.id - b.id) FROM p a JOIN (SELECT * FROM p WHERE id % 3 = 0) b \
             ON a.id <> b.id AND overlap(a.elements, b.elements) >= 3",
            "SELECT count(*), sum(left_id * 31 + right_id * overlap) FROM intersect_families('p', 'q', 'counts')",
        ]
        .into_iter()
        .enumerate()
        {
            // The second query's file is first cut by DataFusion into byte ranges (its one row
            // group read by one of them): cut by rows all the same.
            let min_size = if i == 0 { 10 << 20 } else { 1 };
            ctx.sql(&format!("SET datafusion.optimizer.repartition_file_min_size = {min_size}"))
                .await
                .unwrap()
                .collect()
                .await
                .unwrap();
            let plan = sql_rows(&ctx, &format!("EXPLAIN {q}")).await.join("\n");
            assert!(plan.contains("SimilarityJoinExec") || plan.contains("FamiliesExec"), "{plan}");
            // 40,000 rows: four ranges (target_partitions) of one row group.
            assert!(plan.contains("file_groups={4 groups: [[") && plan.contains("sets.parquet]]}"), "{plan}");
            let got = sql_rows(&ctx, q).await;
            let in_memory = q.replace(" p ", " m ").replace("('p'", "('m'");
            assert_eq!(got, sql_rows(&ctx, &in_memory).await, "{q}: against the table in memory");
            // DataFusion's file groups (its own nested-loop plan takes minutes at this size).
            ctx.sql("SET setfusion.scan_ranges = false").await.unwrap().collect().await.unwrap();
            let plan = sql_rows(&ctx, &format!("EXPLAIN {q}")).await.join("\n");
            assert!(plan.contains(if i == 0 { "file_groups={1 group: [[" } else { "sets.parquet:0.." }), "{plan}");
            assert_eq!(got, sql_rows(&ctx, q).await, "{q}: against one file group");
            ctx.sql("SET setfusion.scan_ranges = true").await.unwrap().collect().await.unwrap();
        }
        // A Ballista plan's codec does not carry row selections: no ranges there.
        ctx.sql("SET setfusion.hash_partition_inputs = true").await.unwrap().collect().await.unwrap();
        let q = "SELECT count(*) FROM p a JOIN p b ON a.id < b.id AND jaccard(a.elements, b.elements) >= 0.6";
        let plan = sql_rows(&ctx, &format!("EXPLAIN {q}")).await.join("\n");
        assert!(plan.contains("sets.parquet:0..") && !plan.contains("sets.parquet]"), "{plan}");
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// A self join over a Parquet file keeps its preprocessed sets: asked again
/// (another threshold), it reads only the id column and answers as the table
/// in memory; a query whose output reads the sets reads them; a rewritten
/// file is read again; `sets_cache_limit = 0` keeps nothing.
#[test]
fn a_self_join_keeps_its_sets_between_queries() {
    let _device = crate::common::shared_device();
    let use_gpu = gpu().is_some();
    block_on(move || async move {
        let ctx = similarity_session(use_gpu).await;
        let table = |seed: u64, n: usize| {
            let mut rng = StdRng::seed_from_u64(seed);
            let sets: Vec<Option<Vec<Option<i64>>>> = (0..n)
                .map(|i| match i % 499 {
                    0 => None,
                    1 => Some(vec![]),
                    2 => Some(vec![Some(5), None, Some(5)]),
                    _ => Some((0..rng.random_range(1..7)).map(|_| Some(rng.random_range(0..120i64))).collect()),
                })
                .collect();
            id_sets_table(sets)
        };
        let dir = std::env::temp_dir().join(format!("setfusion-ssjoin-kept-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sets.parquet");
        let q = |t: f64| {
            format!("SELECT count(*), sum(a.id * 7 + b.id) FROM p a JOIN p b ON a.id < b.id AND jaccard(a.elements, b.elements) >= {t}")
        };
        let ran = |plan: &str| {
            let at = plan.find("ran=").unwrap_or_else(|| panic!("no ran= in {plan}"));
            plan[at..].split(", metrics=").next().unwrap().to_string()
        };
        for (round, (seed, n)) in [(3u64, 12_000usize), (4, 12_500)].into_iter().enumerate() {
            let batch = table(seed, n);
            write_parquet(&path, &batch);
            let _ = ctx.deregister_table("p");
            let _ = ctx.deregister_table("m");
            ctx.register_parquet("p", path.to_str().unwrap(), Default::default()).await.unwrap();
            ctx.register_batch("m", batch).unwrap();
            for (i, t) in [0.5, 0.8, 0.5].into_iter().enumerate() {
                let plan = sql_rows(&ctx, &format!("EXPLAIN ANALYZE {}", q(t))).await.join("\n");
                let how = ran(&plan);
                // The first query of each file reads and keeps the sets (in the second
                // round the file was rewritten: its old sets are never served).
                let want =
                    if i == 0 { "the sets kept for later queries" } else { "the sets kept from an earlier query" };
                assert!(how.contains(want), "round {round}, query {i}: {how}");
                let got = sql_rows(&ctx, &q(t)).await;
                assert_eq!(got, sql_rows(&ctx, &q(t).replace(" p ", " m ")).await, "round {round}, t = {t}");
            }
            // The output reads the sets: they are read from the file.
            let reads = "SELECT count(*), sum(cardinality(b.elements)) FROM p a JOIN p b \
                         ON a.id < b.id AND jaccard(a.elements, b.elements) >= 0.7";
            let plan = sql_rows(&ctx, &format!("EXPLAIN ANALYZE {reads}")).await.join("\n");
            assert!(!ran(&plan).contains("the sets kept"), "{}", ran(&plan));
            assert_eq!(sql_rows(&ctx, reads).await, sql_rows(&ctx, &reads.replace(" p ", " m ")).await);
        }
        ctx.sql("SET setfusion.sets_cache_limit = 0").await.unwrap().collect().await.unwrap();
        let plan = sql_rows(&ctx, &format!("EXPLAIN ANALYZE {}", q(0.6))).await.join("\n");
        assert!(!ran(&plan).contains("the sets kept"), "{}", ran(&plan));
        assert_eq!(sql_rows(&ctx, &q(0.6)).await, sql_rows(&ctx, &q(0.6).replace(" p ", " m ")).await);
        let _ = std::fs::remove_dir_all(&dir);
    });
}
