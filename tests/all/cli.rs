//! The command line as a user runs it (the built `setfusion` binary).

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// The binary: `SETFUSION_BIN`, else the one cargo built with this test.
fn binary() -> Option<PathBuf> {
    let path = std::env::var_os("SETFUSION_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_setfusion")));
    path.exists().then_some(path)
}

/// `setfusion -c "..." | head -1`: the reader closes the pipe after one line;
/// setfusion stops quietly with status 0 (as `cat` does), not with
/// `Error: IO error: Broken pipe`. Every output format.
#[test]
fn closed_output_pipe_ends_quietly() {
    let Some(bin) = binary() else {
        eprintln!("skipping: no setfusion binary (set SETFUSION_BIN)");
        return;
    };
    for format in ["table", "csv", "json"] {
        let mut child = Command::new(&bin)
            .args(["--format", format, "-c", "SELECT value, value * 2 AS twice FROM generate_series(1, 200000)"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start setfusion");
        let mut first = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut first).expect("one line");
        // The reader is dropped here: the pipe is closed with most of the output unwritten.
        assert!(!first.is_empty(), "{format}: no output");
        let mut stderr = String::new();
        child.stderr.take().expect("stderr").read_to_string(&mut stderr).expect("stderr");
        let status = child.wait().expect("wait");
        assert!(status.success(), "{format}: {status}, stderr: {stderr}");
        assert!(stderr.trim().is_empty(), "{format}: stderr: {stderr}");
    }
}
