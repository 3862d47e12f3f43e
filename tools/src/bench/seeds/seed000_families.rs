//! Seed 000 (Fort, Sellarès, Valladares: the intersection of two families of
//! sets with frequencies), cases B1-B4 of its digest. The paper ran on a
//! K40 with an i7-2630QM; only the prose's figures survive (no plot values).

use setfusion::algo::families::{self, PairSpace};
use setfusion::gpu::TransferStats;

use super::{block_on, ms, times, Answers, Bench, Row, Table};
use datafusion::error::Result;

/// The paper's GPU totals at its smallest and largest k (uniform, similar), in ms.
const PAPER_GPU_MS: [(usize, f64, f64); 2] = [(5_000, 8_000.0, 500.0), (50_000, 99_000.0, 1_200.0)];

pub(crate) fn table(b: &Bench) -> Result<Table> {
    let mut t = Table::new("Seed 000: intersecting two families of sets (Fort et al.; K40 + i7-2630QM)");
    t.notes.push(
        "uniform: k = k' sets of 100-150 elements uniform over a domain of 100,000 (the paper's recipe); \
         similar: the paper gives no recipe, so each family has 50 base sets and every set is a base with ~10% \
         of its elements replaced (the two families share few elements)"
            .into(),
    );
    t.notes.push(
        "setfusion: the GPU backend's time from the families' arrays (uploads and downloads included), \
         and `SELECT count(*), sum(frequency) FROM intersect_families('f', 'g')` over in-memory tables; the \
         CPU backend through SQL up to k = 10,000 (the answers of both backends are compared)"
            .into(),
    );
    t.rows.push(figure1(b)?);
    let sizes: &[usize] = if b.quick { &[300, 600] } else { &[5_000, 10_000, 20_000, 50_000] };
    let cpu_max = if b.quick { usize::MAX } else { 10_000 };
    for kind in ["uniform", "similar"] {
        for &k in sizes {
            t.rows.push(families_case(b, kind, k, cpu_max)?);
        }
    }
    t.rows.extend(modes(b)?);
    Ok(t)
}

/// B1: figure 1's families give exactly 9 distinct sets.
fn figure1(b: &Bench) -> Result<Row> {
    let (f, g) = families::tests_data::figure1();
    let space = PairSpace { left: &f, right: &g, right_from: None };
    let cpu = families::distinct_cpu(&space);
    let mut answers = Answers::check(cpu.len() == 9, || format!("CPU: {} sets, not 9", cpu.len()));
    let mut ours = format!("CPU: {} sets", cpu.len());
    if let Some(r) = b.on_gpu(|g| families::distinct_gpu(g, &space, &mut TransferStats::default())) {
        let (gpu, _) = r?;
        ours += &format!("; GPU: {} sets", gpu.len());
        answers = answers.and(Answers::check(gpu == cpu, || "GPU's sets differ from the CPU's".into()));
    }
    Ok(Row::new("B1 figure 1", "exactly 9 sets", ours).answers(answers))
}

/// B2 / B3: one size of one kind.
fn families_case(b: &Bench, kind: &str, k: usize, cpu_max: usize) -> Result<Row> {
    let (f, g) = match kind {
        "uniform" => families::tests_data::uniform(k, 42),
        _ => crate::bench::families::similar(k, 42),
    };
    let space = PairSpace { left: &f, right: &g, right_from: None };
    let mut parts = Vec::new();
    let mut answers = Answers::Unchecked;
    let mut gpu_result = None;
    let mut gpu_ms = None;
    if let Some(r) = b.on_gpu(|gpu| b.time(true, || families::distinct_gpu(gpu, &space, &mut TransferStats::default())))
    {
        let (t, (d, slices)) = r?;
        parts.push(format!("GPU backend {} ({} distinct sets, {slices} slice(s))", ms(t), d.len()));
        gpu_result = Some(d);
        let (sql, _) = block_on(crate::bench::families::sql_time(&f, &g, false, b.runs))?;
        let sql = sql.as_secs_f64() * 1e3;
        parts.push(format!("GPU from SQL {}", ms(sql)));
        gpu_ms = Some(sql);
    }
    if k <= cpu_max {
        let (sql, _) = block_on(crate::bench::families::sql_time(&f, &g, true, b.runs.min(2)))?;
        parts.push(format!("CPU from SQL {}", ms(sql.as_secs_f64() * 1e3)));
        let cpu = families::distinct_cpu(&space);
        answers = match &gpu_result {
            Some(d) => Answers::check(*d == cpu, || format!("k = {k}: GPU and CPU sets differ")),
            None => Answers::check(cpu.len() as u64 <= space.pair_count(0..f.len()), || {
                "more distinct sets than pairs".into()
            }),
        };
    }
    let paper = PAPER_GPU_MS.iter().find(|p| p.0 == k);
    let paper_ms = paper.map(|p| if kind == "uniform" { p.1 } else { p.2 });
    let paper_text = match (kind, paper_ms) {
        (_, Some(p)) => format!("GPU total {}", ms(p)),
        ("uniform", None) => "GPU total 8-99 s over k = 5,000-50,000".into(),
        _ => "GPU total 0.5-1.2 s over k = 5,000-50,000".into(),
    };
    let case = format!("B{} {kind} k = {k}", if kind == "uniform" { 2 } else { 3 });
    let row = Row::new(case, paper_text, parts.join("; ")).answers(answers);
    Ok(match (paper_ms, gpu_ms) {
        (Some(p), Some(g)) => row.ratio(format!("{} the paper's GPU (SQL)", times(p, g))),
        _ => row,
    })
}

/// B4: chunked mode (the GPU held to a small memory limit, so the pairs run
/// in slices) and self mode (one family with itself, pairs i < j), both equal
/// to the CPU backend.
fn modes(b: &Bench) -> Result<Vec<Row>> {
    let k = if b.quick { 400 } else { 20_000 };
    let (f, g) = families::tests_data::uniform(k, 7);
    let space = PairSpace { left: &f, right: &g, right_from: None };
    let cpu = families::distinct_cpu(&space);
    let chunked = match &b.gpu {
        Some(gpu) => {
            let whole = families::distinct_gpu(&gpu.lease(0), &space, &mut TransferStats::default())?;
            let limit = if b.quick { 4 << 20 } else { 256 << 20 };
            let (t, (sliced, slices)) =
                b.time(false, || families::distinct_gpu(&gpu.lease(limit), &space, &mut TransferStats::default()))?;
            Row::new(
                format!("B4 chunked, k = {k}"),
                "no figure (the paper describes the mode at k = 50,000); k = 20,000 here, where the CPU backend's \
                 answer, which every slice is checked against, takes seconds, not minutes",
                format!(
                    "{} slices under a {} MiB limit: {}, against one pass's {} slice(s)",
                    slices,
                    limit >> 20,
                    ms(t),
                    whole.1
                ),
            )
            .answers(Answers::check(sliced == cpu && whole.0 == cpu, || "sliced sets differ from the CPU's".into()))
        }
        None => Row::not_run(format!("B4 chunked, k = {k}"), "no figure", "no GPU (the CPU backend does not slice)"),
    };
    let from: Vec<u32> = (1..=f.len() as u32).collect();
    let own = PairSpace { left: &f, right: &f, right_from: Some(&from) };
    let (t_cpu, cpu_self) = b.time(false, || Ok(families::distinct_cpu(&own)))?;
    // Brute force (every pair merged) where it is cheap.
    let mut answers = if k <= 1_000 {
        let brute = families::distinct_of(&[&families::pairs_brute_force(&own)]);
        Answers::check(cpu_self == brute, || "self mode: CPU differs from brute force".into())
    } else {
        Answers::Unchecked
    };
    let mut ours = format!("{} pairs, {} distinct sets; CPU {}", own.pair_count(0..f.len()), cpu_self.len(), ms(t_cpu));
    if let Some(r) = b.on_gpu(|gpu| b.time(true, || families::distinct_gpu(gpu, &own, &mut TransferStats::default()))) {
        let (t, (d, _)) = r?;
        ours += &format!("; GPU {}", ms(t));
        answers = answers.and(Answers::check(d == cpu_self, || "self mode: GPU differs from CPU".into()));
    }
    let self_row = Row::new(format!("B4 self mode, k = {k}"), "no figure", ours).answers(answers);
    Ok(vec![chunked, self_row])
}
