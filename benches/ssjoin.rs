//! `cargo bench --bench ssjoin -- [--out FILE] [--quick] [--reps N] [--no-nlj]
//! [--collections dblp,uniform,zipf] [--sets 100000,1000000] [--thresholds 0.5,0.6]
//! [--cpu-timeout-s S] [--no-cpu]`: see `setfusion_tools::bench::ssjoin` (also
//! `setfusion bench ssjoin ...`, which takes the same options).
use clap::Parser;

/// The similarity-join benchmark: GPU vs CPU backend.
#[derive(Parser)]
#[command(name = "ssjoin")]
struct Command {
    #[command(flatten)]
    options: setfusion_tools::bench::ssjoin::Options,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() {
    setfusion_tools::bench::ssjoin::run(Command::parse().options);
}
