//! The notes a prediction gathers: what it assumed, and where it left what was measured. Its
//! own module because the model and the network part both write them.

/// Notes gathered while predicting.
#[derive(Default)]
pub(super) struct Notes {
    pub(super) assumptions: Vec<String>,
    pub(super) extrapolations: Vec<String>,
}

impl Notes {
    pub(super) fn assume(&mut self, s: impl Into<String>) {
        self.assumptions.push(s.into());
    }
    pub(super) fn extrapolate(&mut self, s: impl Into<String>) {
        self.extrapolations.push(s.into());
    }
}
