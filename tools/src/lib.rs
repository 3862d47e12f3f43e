//! The `setfusion` command and the tools built on the library ([`setfusion`]):
//! the command line ([`cli`]: demo, doctor, SQL, a Ballista cluster), the
//! benchmarks ([`bench`]), the sqllogictest runner ([`slt`]), the differential
//! fuzzer ([`fuzz`]), data generators ([`datagen`]) and their knobs ([`env`]).

pub mod bench;
pub mod cli;
pub mod datagen;
pub mod env;
pub mod fuzz;
pub mod slt;
