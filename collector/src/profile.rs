//! The profile file.
