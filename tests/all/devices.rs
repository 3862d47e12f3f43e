//! Several GPUs (issues 17 and 30): `SET setfusion.devices` splits a set
//! operation or semi / anti join across the listed devices: probe rows by
//! ranges over merged build bitmaps on dense keys (semi / anti joins also on
//! sparse keys, the build side on every device), else by key hash. The
//! answers must equal the CPU backend's with one device, several, or none.
//! Where only one GPU is present, '0,0' and '0,0,0' stand in for two and three
//! devices: the split and the mapping back run as on several GPUs, the
//! shares taking the one device in turn; where two are, 'all' runs on both.

use std::sync::Arc;

use datafusion::prelude::{SessionConfig, SessionContext};
use setfusion_tools::datagen;

use crate::common::{block_on, gpu_or_skip, shared_device};

const QUERIES: &[&str] = &[
    "SELECT count(*), sum(v) FROM a WHERE k IN (SELECT k FROM b)",
    "SELECT count(*), sum(v) FROM a WHERE k NOT IN (SELECT k FROM b)",
    "SELECT count(*), sum(v) FROM a WHERE NOT EXISTS (SELECT 1 FROM b WHERE b.k = a.k)",
    "SELECT count(*), sum(k) FROM (SELECT k FROM a INTERSECT ALL SELECT k FROM b)",
    "SELECT count(*), sum(k) FROM (SELECT k FROM a EXCEPT ALL SELECT k FROM b)",
    "SELECT count(*), sum(k) FROM (SELECT k FROM a INTERSECT SELECT k FROM b)",
    "SELECT count(*), sum(k) FROM (SELECT k FROM a EXCEPT SELECT k FROM b)",
    "SELECT count(*), sum(v) FROM a WHERE k IN (SELECT k FROM b) OR v < 10",
    // Distinct build keys over a dense domain: bitmaps, probe rows split by
    // ranges across the devices, ranks carried from range to range.
    "SELECT count(*), sum(k) FROM (SELECT k FROM c INTERSECT ALL SELECT k FROM d)",
    "SELECT count(*), sum(k) FROM (SELECT k FROM c EXCEPT ALL SELECT k FROM d)",
    "SELECT count(*), sum(k) FROM (SELECT k FROM c INTERSECT SELECT k FROM d)",
    "SELECT count(*), sum(v) FROM c WHERE EXISTS (SELECT 1 FROM d WHERE d.k = c.k)",
    "SELECT count(*), sum(v) FROM c WHERE k NOT IN (SELECT k FROM d)",
];

/// The query over distinct dense keys whose EXPLAIN ANALYZE shows the row-range split.
const ROWS_SPLIT_QUERY: usize = 8;

async fn answers(ctx: &SessionContext) -> Vec<String> {
    let mut out = Vec::new();
    for q in QUERIES {
        let batches = ctx
            .sql(q)
            .await
            .unwrap_or_else(|e| panic!("{q}: {e}"))
            .collect()
            .await
            .unwrap_or_else(|e| panic!("{q}: {e}"));
        out.push(datafusion::arrow::util::pretty::pretty_format_batches(&batches).unwrap().to_string());
    }
    out
}

#[test]
fn the_same_answers_on_one_device_several_or_none() {
    let _device = shared_device();
    let gpu = gpu_or_skip().is_ok();
    block_on(move || async move {
        // Keys with repeats on both sides (the ALL rules' counts must survive the split).
        let n = 400_000;
        let a = Arc::new(datagen::key_table(n, |i| datagen::key_a(i) % 150_000, true, 4).unwrap());
        let b = Arc::new(datagen::key_table(n, |i| datagen::key_b(i) % 200_000, false, 4).unwrap());
        // Distinct keys in [0, 600,000) on the build side; the probe side's repeat.
        let c = Arc::new(datagen::key_table(n, |i| ((i * 7919) % 500_000 % 250_000) as i64, true, 4).unwrap());
        let d = Arc::new(datagen::key_table(n, |i| ((i * 104_729) % 600_000) as i64, false, 4).unwrap());
        let session = |settings: &[&str]| {
            let (a, b, c, d) = (a.clone(), b.clone(), c.clone(), d.clone());
            let settings: Vec<String> = settings.iter().map(|s| s.to_string()).collect();
            async move {
                let ctx = setfusion::context_with_config(SessionConfig::new().with_target_partitions(4));
                ctx.register_table("a", a).unwrap();
                ctx.register_table("b", b).unwrap();
                ctx.register_table("c", c).unwrap();
                ctx.register_table("d", d).unwrap();
                for s in settings {
                    ctx.sql(&s).await.unwrap().collect().await.unwrap();
                }
                ctx
            }
        };
        let want = answers(&session(&["SET setfusion.strategy = 'cpu'"]).await).await;
        for devices in ["", "0,0", "0,0,0", "all"] {
            let ctx = session(&["SET setfusion.min_rows = 0", &format!("SET setfusion.devices = '{devices}'")]).await;
            let got = answers(&ctx).await;
            for ((q, g), w) in QUERIES.iter().zip(&got).zip(&want) {
                assert_eq!(g, w, "devices '{devices}': {q}");
            }
            // 'all' is both GPUs where two are present.
            let parts = if devices == "all" { setfusion::gpu::device_count() } else { devices.split(',').count() };
            if gpu && !devices.is_empty() && parts > 1 {
                let analyzed =
                    ctx.sql(&format!("EXPLAIN ANALYZE {}", QUERIES[3])).await.unwrap().collect().await.unwrap();
                let text = datafusion::arrow::util::pretty::pretty_format_batches(&analyzed).unwrap().to_string();
                assert!(text.contains(&format!("{parts} key partitions")), "devices '{devices}':\n{text}");
                let analyzed = ctx
                    .sql(&format!("EXPLAIN ANALYZE {}", QUERIES[ROWS_SPLIT_QUERY]))
                    .await
                    .unwrap()
                    .collect()
                    .await
                    .unwrap();
                let text = datafusion::arrow::util::pretty::pretty_format_batches(&analyzed).unwrap().to_string();
                assert!(text.contains(&format!("probe rows in {parts} ranges")), "devices '{devices}':\n{text}");
            }
        }
        // A setting that names no devices is refused when it is made.
        let ctx = session(&[]).await;
        let e = match ctx.sql("SET setfusion.devices = 'gpu0'").await {
            Err(e) => e,
            Ok(df) => df.collect().await.err().expect("an invalid list is refused"),
        };
        assert!(e.to_string().contains("invalid setfusion.devices"), "{e}");
    });
}
