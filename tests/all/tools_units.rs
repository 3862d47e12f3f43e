//! The command's own unit tests (its grammar, output, demo cells, `bench
//! seeds --quick`, the slt runner's decimals), here rather than in the tools
//! library: a test target of that library would compile all of it a second
//! time in the README's test command (about a minute and a half of a first
//! run on two cores).

mod cli_output {
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::array::RecordBatch;
    use datafusion::error::DataFusionError;
    use setfusion_tools::cli::*;
    use std::io::Write;
    use std::sync::Arc;

    /// A reader that went away: every write fails with EPIPE.
    struct ClosedPipe;
    impl Write for ClosedPipe {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Err(std::io::ErrorKind::BrokenPipe.into())
        }
    }

    #[test]
    fn a_closed_pipe_is_recognised_in_every_format() {
        let batch = RecordBatch::try_from_iter(vec![("x", Arc::new(Int64Array::from(vec![1, 2, 3])) as _)]).unwrap();
        for format in [Format::Table, Format::Csv, Format::Json] {
            let e = print_batches(&mut ClosedPipe, std::slice::from_ref(&batch), format).expect_err("writes fail");
            assert!(is_broken_pipe(&e), "{format:?}: {e}");
        }
        assert!(!is_broken_pipe(&DataFusionError::Plan("x".into())));
        assert!(!is_broken_pipe(&DataFusionError::IoError(std::io::ErrorKind::NotFound.into())));
    }

    /// CSV prints list columns (what set-valued functions return) as the
    /// table format does; Arrow's CSV writer alone refuses nested types.
    #[test]
    fn csv_prints_lists() {
        use datafusion::arrow::array::ListArray;
        use datafusion::arrow::datatypes::Int64Type;
        let lists =
            ListArray::from_iter_primitive::<Int64Type, _, _>(vec![Some(vec![Some(2), None]), None, Some(vec![])]);
        let batch = RecordBatch::try_from_iter(vec![
            ("id", Arc::new(Int64Array::from(vec![1, 2, 3])) as _),
            ("s", Arc::new(lists) as _),
        ])
        .unwrap();
        let mut out = Vec::new();
        print_batches(&mut out, std::slice::from_ref(&batch), Format::Csv).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "id,s\n1,\"[2, ]\"\n2,\n3,[]\n");
    }
}

/// The command line's grammar: what parses, what answers `--help`, what is refused.
mod cli_grammar {
    use std::path::PathBuf;

    use clap::error::ErrorKind;
    use clap::CommandFactory;
    use clap::Parser;
    use setfusion_tools::cli::*;

    fn argv(line: &[&str]) -> Vec<String> {
        std::iter::once("setfusion").chain(line.iter().copied()).map(String::from).collect()
    }

    fn parse(line: &[&str]) -> Cli {
        Cli::try_parse_from(argv(line)).unwrap_or_else(|e| panic!("{line:?}: {}", parse_error_line(&e, &argv(line))))
    }

    fn refused(line: &[&str]) -> clap::Error {
        match Cli::try_parse_from(std::iter::once("setfusion").chain(line.iter().copied())) {
            Ok(cli) => panic!("{line:?} parsed: {cli:?}"),
            Err(e) => e,
        }
    }

    fn bench(line: &[&str]) -> Bench {
        match parse(line).command {
            Some(Command::Bench { bench }) => bench,
            other => panic!("{line:?}: {other:?}"),
        }
    }

    #[test]
    fn the_grammar_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sql_mode() {
        let cli = parse(&[
            "-t",
            "a=a.parquet",
            "--table",
            "b=/data/b",
            "-c",
            "SELECT 1",
            "--command",
            "-- a comment\nSELECT 2",
            "-f",
            "q.sql",
            "--file",
            "r.sql",
            "--format",
            "csv",
        ]);
        assert!(cli.command.is_none());
        let s = cli.sql;
        assert_eq!(s.tables, [("a".to_string(), PathBuf::from("a.parquet")), ("b".into(), PathBuf::from("/data/b"))]);
        assert_eq!(s.commands, ["SELECT 1", "-- a comment\nSELECT 2"]);
        assert_eq!(s.files, [PathBuf::from("q.sql"), PathBuf::from("r.sql")]);
        assert_eq!(s.format, Format::Csv);
        assert_eq!(s.cluster, None);

        let s = parse(&["--cluster", "df://127.0.0.1:50050", "--table", "a=x=y.csv", "-c", "SELECT 1"]).sql;
        assert_eq!(s.cluster.as_deref(), Some("df://127.0.0.1:50050"));
        assert_eq!(s.tables, [("a".to_string(), PathBuf::from("x=y.csv"))]);
        assert_eq!(s.format, Format::Table);

        // No argument at all: the REPL (or statements from a pipe).
        let cli = parse(&[]);
        assert!(cli.command.is_none() && cli.sql.commands.is_empty() && cli.sql.files.is_empty());
        assert_eq!(parse(&["--format", "json"]).sql.format, Format::Json);
    }

    #[test]
    fn subcommands() {
        assert!(matches!(parse(&["demo"]).command, Some(Command::Demo)));
        assert!(matches!(parse(&["doctor"]).command, Some(Command::Doctor(DoctorArgs { start_probe: false }))));
        assert!(matches!(
            parse(&["doctor", "--start-probe"]).command,
            Some(Command::Doctor(DoctorArgs { start_probe: true }))
        ));
        match parse(&["slt", "a.slt", "sql-tests/b.slt"]).command {
            Some(Command::Slt(SltArgs { files })) => {
                assert_eq!(files, [PathBuf::from("a.slt"), PathBuf::from("sql-tests/b.slt")])
            }
            other => panic!("{other:?}"),
        }
        match parse(&["fuzz", "--queries", "10000", "--seed", "20261124", "--max-rows", "100000", "--cpu-only"]).command
        {
            Some(Command::Fuzz(f)) => {
                let o = setfusion_tools::fuzz::FuzzOptions::from(f);
                assert_eq!((o.queries, o.seed, o.max_rows, o.gpu), (10_000, 20_261_124, 100_000, false));
            }
            other => panic!("{other:?}"),
        }
        match parse(&["fuzz"]).command {
            Some(Command::Fuzz(f)) => {
                let (o, d) =
                    (setfusion_tools::fuzz::FuzzOptions::from(f), setfusion_tools::fuzz::FuzzOptions::default());
                assert_eq!((o.queries, o.seed, o.max_rows, o.gpu), (d.queries, d.seed, d.max_rows, d.gpu));
            }
            other => panic!("{other:?}"),
        }
        match parse(&["scheduler", "--port", "50060", "--bind", "0.0.0.0"]).command {
            Some(Command::Scheduler(s)) => assert_eq!((s.port, s.bind.as_str()), (50060, "0.0.0.0")),
            other => panic!("{other:?}"),
        }
        match parse(&["scheduler"]).command {
            Some(Command::Scheduler(s)) => assert_eq!((s.port, s.bind.as_str()), (50050, "127.0.0.1")),
            other => panic!("{other:?}"),
        }
        let line = [
            "executor",
            "--scheduler",
            "10.0.0.1:50070",
            "--port",
            "50071",
            "--grpc-port",
            "50072",
            "--tasks",
            "2",
            "--data-dir",
            "/data",
            "--data-dir",
            "/more",
            "--work-dir",
            "/work",
            "--devices",
            "0,1",
            "--bind",
            "0.0.0.0",
        ];
        match parse(&line).command {
            Some(Command::Executor(e)) => {
                assert_eq!(e.scheduler, ("10.0.0.1".to_string(), 50070));
                assert_eq!((e.port, e.grpc_port, e.tasks, e.bind.as_str()), (50071, Some(50072), Some(2), "0.0.0.0"));
                assert_eq!(e.data_dirs, [PathBuf::from("/data"), PathBuf::from("/more")]);
                assert_eq!(e.work_dir, Some(PathBuf::from("/work")));
                assert_eq!(e.devices, Some(setfusion::config::Devices::List(vec![0, 1])));
            }
            other => panic!("{other:?}"),
        }
        match parse(&["executor"]).command {
            Some(Command::Executor(e)) => {
                assert_eq!(e.scheduler, ("127.0.0.1".to_string(), 50050));
                assert_eq!((e.port, e.grpc_port, e.tasks, e.devices), (50051, None, None, None));
                assert!(e.data_dirs.is_empty() && e.work_dir.is_none());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn benchmarks() {
        assert!(matches!(bench(&["bench", "setops"]), Bench::Setops));
        assert!(matches!(bench(&["bench", "filter"]), Bench::Filter));
        let Bench::Seeds(s) = bench(&["bench", "seeds", "--quick", "--seeds", "001,004"]) else { panic!() };
        assert!(s.quick && s.seeds == ["001", "004"] && s.runs == 3);

        let Bench::Tpch(t) = bench(&[
            "bench",
            "tpch",
            "--sf",
            "10",
            "--runs",
            "3",
            "--queries",
            "q4,q16,q21",
            "--out",
            "t.md",
            "--svg",
            "c.svg",
        ]) else {
            panic!()
        };
        assert_eq!((t.sf, t.runs, t.queries.as_slice()), (10.0, 3, ["q4", "q16", "q21"].map(String::from).as_slice()));
        assert_eq!((t.out, t.svg), (Some(PathBuf::from("t.md")), Some(PathBuf::from("c.svg"))));
        let Bench::Tpch(t) = bench(&["bench", "tpch", "--sf", "10", "--chart-from", "a.md,b.md", "--svg", "c.svg"])
        else {
            panic!()
        };
        assert_eq!(t.chart_from, [PathBuf::from("a.md"), PathBuf::from("b.md")]);
        // The fresh-process child the benchmark starts (`fresh_process`).
        let Bench::Tpch(t) = bench(&["bench", "tpch", "--sf", "0.1", "--one", "q4", "--engine", "datafusion"]) else {
            panic!()
        };
        assert_eq!((t.sf, t.one.as_deref(), t.engine.as_str()), (0.1, Some("q4"), "datafusion"));
        let Bench::Tpch(t) = bench(&["bench", "tpch"]) else { panic!() };
        assert_eq!((t.sf, t.runs, t.queries.len(), t.one), (1.0, 5, 0, None));

        let Bench::Parquet(p) = bench(&["bench", "parquet", "--runs", "3", "--codecs", "snappy", "--no-fresh"]) else {
            panic!()
        };
        assert_eq!((p.runs, p.codecs.as_slice(), p.no_fresh), (Some(3), ["snappy".to_string()].as_slice(), true));
        let Bench::Parquet(p) = bench(&["bench", "parquet"]) else { panic!() };
        assert_eq!(
            (p.runs, p.codecs.as_slice(), p.no_fresh),
            (None, ["snappy", "zstd"].map(String::from).as_slice(), false)
        );
        let Bench::Parquet(p) = bench(&["bench", "parquet", "--one", "in", "--engine", "setfusion", "--codec", "zstd"])
        else {
            panic!()
        };
        assert_eq!((p.one.as_deref(), p.engine.as_str(), p.codec.as_str()), (Some("in"), "setfusion", "zstd"));

        let Bench::Families(f) = bench(&[
            "bench",
            "families",
            "--sizes",
            "5000,10000",
            "--kinds",
            "uniform",
            "--cpu-max",
            "8000",
            "--runs",
            "2",
        ]) else {
            panic!()
        };
        assert_eq!(
            (f.sizes.as_slice(), f.kinds.as_slice()),
            ([5000, 10000].as_slice(), ["uniform".to_string()].as_slice())
        );
        assert_eq!((f.cpu_max, f.runs), (8000, 2));
        let Bench::Families(f) = bench(&["bench", "families"]) else { panic!() };
        assert_eq!((f.sizes.len(), f.kinds.len(), f.cpu_max, f.runs), (4, 2, 10_000, 3));

        let Bench::Lists(l) = bench(&[
            "bench",
            "lists",
            "--rows",
            "200000",
            "--batch-rows",
            "4096",
            "--max-len",
            "50",
            "--queries",
            "10",
            "--terms",
            "8",
            "--max-list",
            "5000",
            "--domain",
            "100",
            "--partitions",
            "4",
            "--distinct-rows",
            "50000",
            "--runs",
            "1",
            "--skip-kway",
            "--strings",
        ]) else {
            panic!()
        };
        assert_eq!((l.rows, l.batch_rows, l.max_len, l.queries, l.terms), (200_000, 4096, 50, 10, 8));
        assert_eq!((l.max_list, l.domain, l.partitions, l.distinct_rows, l.runs), (5000, 100, 4, Some(50_000), 1));
        assert!(l.skip_kway && l.strings && !l.skip_rows);

        let Bench::Ssjoin(s) = bench(&[
            "bench",
            "ssjoin",
            "--collections",
            "uniform,ZIPF",
            "--sets",
            "100000",
            "--thresholds",
            "0.5,0.6",
            "--reps",
            "3",
            "--no-nlj",
            "--no-cpu",
            "--cpu-timeout-s",
            "2.5",
            "--out",
            "s.md",
        ]) else {
            panic!()
        };
        assert_eq!(s.collections, ["uniform", "ZIPF"]);
        assert_eq!(
            (s.sets.as_slice(), s.thresholds.as_slice(), s.reps),
            ([100_000].as_slice(), [0.5, 0.6].as_slice(), 3)
        );
        assert!(s.no_nlj && s.no_cpu && !s.quick);
        assert_eq!((s.cpu_timeout, s.out.as_deref()), (Some(std::time::Duration::from_millis(2500)), Some("s.md")));
        let Bench::Ssjoin(s) = bench(&["bench", "ssjoin", "--quick"]) else { panic!() };
        assert!(s.quick && s.collections.len() == 3 && s.thresholds.len() == 5 && s.cpu_timeout.is_none());
    }

    /// Every subcommand path of the grammar, e.g. `["bench", "tpch"]`.
    fn command_paths(cmd: &clap::Command, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
        out.push(prefix.clone());
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let mut path = prefix.clone();
            path.push(sub.get_name().to_string());
            command_paths(sub, path, out);
        }
    }

    #[test]
    fn every_subcommand_answers_help_with_a_description() {
        let mut paths = Vec::new();
        command_paths(&Cli::command(), Vec::new(), &mut paths);
        // The top level, demo, doctor, slt, fuzz, bench and its 8 (9 with cluster), scheduler, executor.
        assert_eq!(paths.len(), 16 + usize::from(cfg!(feature = "ballista")), "{paths:?}");
        for path in paths {
            for flag in ["--help", "-h"] {
                let line: Vec<&str> =
                    std::iter::once("setfusion").chain(path.iter().map(String::as_str)).chain([flag]).collect();
                let e = Cli::try_parse_from(&line).expect_err("help is an early exit");
                assert_eq!(e.kind(), ErrorKind::DisplayHelp, "{line:?}: {e}");
                let help = e.render().to_string();
                assert!(help.contains("Usage: setfusion"), "{line:?}: {help}");
                // The first line describes the command.
                assert!(
                    help.lines().next().is_some_and(|l| l.len() > 10 && !l.starts_with("Usage")),
                    "{line:?}: {help}"
                );
            }
        }
        let help = refused(&["bench", "tpch", "--help"]).render().to_string();
        for option in ["--sf", "--runs", "--queries", "--out", "--svg", "--chart-from"] {
            assert!(help.contains(option), "{option}: {help}");
        }
        assert!(!help.contains("--one"), "the child's options stay hidden: {help}");
        assert_eq!(refused(&["--version"]).kind(), ErrorKind::DisplayVersion);
    }

    #[test]
    fn bad_input_is_refused_in_one_line() {
        let cases: &[(&[&str], &str)] = &[
            (&["--format", "xml"], "xml"),
            (&["--table", "nope"], "NAME=PATH"),
            (&["--table", "=x.csv"], "NAME=PATH"),
            (&["-c"], "-c"),
            (&["--bogus"], "--bogus"),
            (&["--table", "a=a.csv", "demo"], "demo"),
            (&["demo", "extra"], "extra"),
            (&["doctor", "--start"], "--start"),
            (&["slt"], "FILE.slt"),
            (&["fuzz", "--queries", "many"], "many"),
            (&["fuzz", "--seed", "-1"], "-1"),
            (&["bench"], ""),
            (&["bench", "nope"], "nope"),
            (&["bench", "tpch", "--sf", "x"], "--sf"),
            (&["bench", "tpch", "--sf", "0"], "positive"),
            (&["bench", "tpch", "--bogus"], "--bogus"),
            (&["bench", "tpch", "--chart-from", "a.md"], "--svg"),
            (&["bench", "parquet", "--codecs", "snappy,lz4"], "lz4"),
            (&["bench", "families", "--kinds", "odd"], "odd"),
            (&["bench", "families", "--sizes", "5000,x"], "x"),
            (&["bench", "lists", "--rows"], "--rows"),
            (&["bench", "ssjoin", "--thresholds", "0.5,1.5"], "1.5"),
            (&["bench", "ssjoin", "--reps", "0"], "--reps"),
            (&["bench", "ssjoin", "--quick", "--sets", "5"], "--sets"),
            (&["bench", "ssjoin", "--collections", "dblp,web"], "web"),
            (&["bench", "ssjoin", "--cpu-timeout-s", "-3"], "-3"),
            (&["bench", "ssjoin", "--cpu-timeout-s", "0"], "positive"),
            (&["bench", "setops", "--rows", "5"], "--rows"),
            (&["scheduler", "--port", "99999"], "99999"),
            (&["executor", "--scheduler", "nohost"], "HOST:PORT"),
            (&["executor", "--scheduler", "h:port"], "not a port"),
            (&["executor", "--tasks", "0"], "positive"),
            (&["executor", "--devices", "0,x"], "0,x"),
            (&["executor", "--grpc-port", "-1"], "-1"),
        ];
        for (line, needle) in cases {
            let e = refused(line);
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                continue; // `setfusion bench`: the list of benchmarks, on stderr, status 1.
            }
            let msg = parse_error_line(&e, &argv(line));
            assert!(!msg.contains('\n'), "{line:?}: {msg}");
            assert!(msg.contains(needle), "{line:?}: {msg}");
            assert!(msg.contains("(see setfusion") && msg.ends_with("--help)"), "{line:?}: {msg}");
        }
        for line in [&["bench", "tpch", "--bogus"][..], &["bench", "tpch", "--sf", "x"]] {
            let msg = parse_error_line(&refused(line), &argv(line));
            assert!(msg.ends_with("(see setfusion bench tpch --help)"), "{line:?}: {msg}");
        }
    }

    #[tokio::test]
    async fn exit_codes() {
        let args = |line: &[&str]| std::iter::once("setfusion").chain(line.iter().copied()).map(String::from).collect();
        assert_eq!(main_with_args(args(&["bench", "tpch", "--help"])).await, 0);
        assert_eq!(main_with_args(args(&["bench", "tpch", "--bogus"])).await, 1);
        assert_eq!(main_with_args(args(&["bench"])).await, 1);
        assert_eq!(main_with_args(args(&["--format", "csv", "-c", "SELECT 1 AS x"])).await, 0);
        assert_eq!(main_with_args(args(&["-c", "SELECT * FROM no_such_table"])).await, 1);
    }
}

mod demo_cells {
    use setfusion_tools::cli::demo::*;
    use setfusion_tools::datagen;
    use std::time::Duration;

    fn ms(v: &[u64]) -> Timings {
        Timings(v.iter().map(|&m| Duration::from_millis(m)).collect())
    }

    #[test]
    fn speedups_are_shown_only_for_different_plans_beyond_noise() {
        assert_eq!(speedup_cell(&ms(&[100, 90, 110]), &ms(&[10, 11, 9]), true), "same plan");
        // A 0.7x from runs whose times overlap is noise, not a slowdown.
        assert_eq!(speedup_cell(&ms(&[70, 100, 72]), &ms(&[101, 99, 98]), false), "noise");
        assert_eq!(speedup_cell(&ms(&[100, 90, 110]), &ms(&[10, 11, 9]), false), "10.0x");
        assert_eq!(speedup_cell(&ms(&[10, 11, 9]), &ms(&[100, 90, 110]), false), "0.1x");
    }

    #[test]
    fn a_declined_marker_leaves_the_plan_the_same() {
        let datafusion = "ProjectionExec: expr=[count(Int64(1))@0]\n  HashJoinExec: mode=Partitioned, join_type=LeftSemi\n    DataSourceExec\n";
        let setfusion = "ProjectionExec: expr=[count(Int64(1))@0]\n  SetfusionDeclinedExec: kept DataFusion's operator below, reason=\"min_rows\"\n    HashJoinExec: mode=Partitioned, join_type=LeftSemi\n      DataSourceExec\n";
        assert_eq!(working_plan(datafusion), working_plan(setfusion));
        assert_ne!(
            working_plan(datafusion),
            working_plan("ProjectionExec: expr=[count(Int64(1))@0]\n  SemiJoinExec\n")
        );
    }

    #[test]
    fn the_gpu_figures_name_the_demo_queries() {
        for (name, datafusion_ms, setfusion_ms, speedup) in H100_SETOPS {
            assert!(datagen::SET_QUERIES.iter().any(|(q, _)| q == name), "{name}");
            // The published speedup is the ratio of the times before they were rounded.
            assert!((datafusion_ms / setfusion_ms - speedup).abs() < 0.15, "{name}");
        }
    }
}

mod seeds_quick {
    use setfusion_tools::bench::seeds::*;

    /// `bench seeds --quick` without a GPU (CI): every seed's cases run, in
    /// small sizes, and every answer matches (a mismatch is an error).
    #[test]
    fn quick_seeds_run_and_their_answers_match() {
        let options = Options { quick: true, ..Options::default() };
        let tables = tables(&options).expect("bench seeds --quick");
        assert_eq!(tables.len(), 5);
        for t in &tables {
            assert!(!t.rows.is_empty(), "{}", t.title);
            let md = t.markdown();
            assert!(!md.contains("DIFFER"), "{md}");
        }
    }

    /// The SIMD baseline's block intersection counts what a set intersection
    /// holds: empty sets, sets shorter than a block, tails of every length,
    /// blocks whose last elements tie, disjoint and equal sets.
    #[test]
    fn simd_blocks_count_the_intersection() {
        let mut rng = data::Rng::new(11);
        for case in 0..400u64 {
            let (na, nb) = (rng.below(60) as usize, rng.below(60) as usize);
            let domain = 1 + rng.below(if case % 3 == 0 { 40 } else { 400 });
            let set = |rng: &mut data::Rng, n: usize| {
                let s: std::collections::BTreeSet<u32> = (0..n).map(|_| rng.below(domain) as u32).collect();
                s.into_iter().collect::<Vec<u32>>()
            };
            let (a, b) = (set(&mut rng, na), set(&mut rng, nb));
            let want = a.iter().filter(|x| b.binary_search(x).is_ok()).count() as u64;
            assert_eq!(simd_count(&a, &b), want, "{a:?} {b:?}");
            assert_eq!(simd_count(&a, &a), a.len() as u64);
        }
    }

    #[test]
    fn data_recipes_hold_what_they_say() {
        let (a, b) = data::overlapping_pair(10_000, 1_000);
        let sa: std::collections::HashSet<u32> = a.iter().copied().collect();
        assert_eq!(sa.len(), 10_000);
        assert_eq!(b.iter().filter(|x| sa.contains(x)).count(), 1_000);
        for dist in [data::Dist::Normal, data::Dist::Uniform, data::Dist::Zipf] {
            let s = data::sorted_set(dist, 1 << 20, 5_000, 7);
            assert_eq!(s.len(), 5_000);
            assert!(s.windows(2).all(|w| w[0] < w[1]), "{dist:?}");
        }
        let mut v: Vec<u32> = data::unique_u32(0, 100_000);
        let mut want = v.clone();
        want.sort_unstable();
        data::parallel_sort(&mut v);
        assert_eq!(v, want);
    }
}

mod slt_decimals {
    use setfusion_tools::slt::normalize::big_decimal_to_str as b;

    #[test]
    fn decimal_strings() {
        assert_eq!(b("0.110", 12), "0.11");
        assert_eq!(b("0.011", 12), "0.011");
        assert_eq!(b("1.1", 12), "1.1");
        assert_eq!(b("11", 12), "11");
        assert_eq!(b("110", 12), "110");
        assert_eq!(b("0", 12), "0");
        assert_eq!(b("-0", 12), "0");
        assert_eq!(b("-0.00", 2), "0");
        assert_eq!(b("-1.10", 2), "-1.1");
        assert_eq!(b("0.12345678901234567890123456789012345678", 12), "0.123456789012");
        assert_eq!(b("-0.12345678901234567890123456789012345678", 12), "-0.123456789012");
        assert_eq!(b("1.0000000000011", 12), "1.000000000001");
        assert_eq!(b("1.0000000000011", 13), "1.0000000000011");
        assert_eq!(b("0.0000000000005", 12), "0");
        assert_eq!(b("0.0000000000015", 12), "0.000000000002");
        assert_eq!(b("0.00000000000051", 12), "0.000000000001");
        assert_eq!(b("9.9999999999999", 12), "10");
        assert_eq!(b("-9.9999999999999", 12), "-10");
        assert_eq!(b("0.30000000000000004", 12), "0.3");
        assert_eq!(b("123.45", 2), "123.45");
        assert_eq!(b("100000000000000000000", 12), "100000000000000000000");
    }
}
