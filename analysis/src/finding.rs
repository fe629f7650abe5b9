//! The single most important finding of a run, in one sentence, with the change it suggests.
