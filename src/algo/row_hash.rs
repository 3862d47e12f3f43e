//! Row hashing and exact verification of hashed keys on the device: work in progress.
