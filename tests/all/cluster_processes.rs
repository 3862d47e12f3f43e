//! A real multi-process cluster (issue 30): `setfusion scheduler` and two
//! `setfusion executor` child processes on loopback ports, started as a user
//! would start them. The demo queries (INTERSECT ALL, EXCEPT ALL, INTERSECT,
//! IN, NOT IN, IN under OR (a mark join), a similarity join) over Parquet
//! files answer as one process does, and an executor refuses a table outside
//! its data folder. The children are stopped when the test ends, passed or not.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use datafusion::prelude::{ParquetReadOptions, SessionConfig};
use setfusion_ballista::{demo, process::free_ports, remote_context};

/// Child processes, killed on drop.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn setfusion(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_setfusion"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("starting setfusion {args:?}: {e}"))
}

fn wait_for_port(port: u16, what: &str, children: &mut Children) {
    setfusion_ballista::process::wait_for_port(port, what, Duration::from_secs(120), &mut children.0)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn separate_processes_answer_like_one_process() {
    let base = std::env::temp_dir().join(format!("setfusion-cluster-processes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let data = base.join("data");
    let outside = base.join("outside");
    demo::write_tables(&data, 6000).await.unwrap();
    demo::write_tables(&outside, 60).await.unwrap();
    let ports = free_ports(5).unwrap();
    let p = |i: usize| ports[i].to_string();
    let mut children = Children(vec![setfusion(&["scheduler", "--port", &p(0)])]);
    wait_for_port(ports[0], "the scheduler", &mut children);
    let scheduler = format!("127.0.0.1:{}", ports[0]);
    let data_dir = data.to_str().unwrap();
    for (flight, grpc) in [(1, 2), (3, 4)] {
        children.0.push(setfusion(&[
            "executor",
            "--scheduler",
            &scheduler,
            "--port",
            &p(flight),
            "--grpc-port",
            &p(grpc),
            "--tasks",
            "2",
            "--data-dir",
            data_dir,
        ]));
    }
    wait_for_port(ports[1], "executor 1", &mut children);
    wait_for_port(ports[3], "executor 2", &mut children);

    let config = || SessionConfig::new().with_target_partitions(4);
    let cluster = remote_context(&format!("df://{scheduler}"), config()).await.unwrap();
    let local = setfusion::context_with_config(config());
    for ctx in [&cluster, &local] {
        demo::register_tables(ctx, &data).await.unwrap();
    }
    for (name, sql) in demo::QUERIES {
        let start = Instant::now();
        let want = demo::sorted_rows(&local, sql).await.unwrap();
        let local_time = start.elapsed();
        assert!(!want.is_empty(), "{name}: the data gives an empty answer");
        let start = Instant::now();
        let got = demo::sorted_rows(&cluster, sql).await.unwrap_or_else(|e| panic!("{name} on the cluster: {e}"));
        println!(
            "cluster processes: {name}: {} rows, {:.0?} on the cluster, {local_time:.0?} in one process",
            got.len(),
            start.elapsed()
        );
        assert_eq!(got, want, "{name}");
    }

    // A table outside the executors' data folder: the client can read its
    // schema, the executors refuse its files.
    let secret = outside.join("r");
    cluster
        .register_parquet("secret", &format!("{}/", secret.to_str().unwrap()), ParquetReadOptions::default())
        .await
        .unwrap();
    let e = demo::sorted_rows(&cluster, "SELECT k, v FROM secret")
        .await
        .expect_err("an executor read a file outside its data folder");
    assert!(e.to_string().contains("outside this executor's data folders"), "{e}");
    drop(children);
    let _ = std::fs::remove_dir_all(&base);
}
