//! What an iteration's pieces add up to: exact nanoseconds per category with the evidence for
//! each, shared by the CPU-side attribution and the GPU timeline.

use crate::category::{apportion, Category, Split};

use super::{Basis, Evidence};

/// Accumulates (category, basis, weight) and turns a piece into exact nanoseconds.
#[derive(Default)]
pub(crate) struct Parts {
    pub(crate) split: Split,
    pub(crate) evidence: Vec<Evidence>,
}

impl Parts {
    pub(crate) fn put(&mut self, category: Category, basis: Basis, ns: u64) {
        if ns == 0 {
            return;
        }
        self.split.add(category, ns);
        match self
            .evidence
            .iter_mut()
            .find(|e| e.category == category && e.basis == basis)
        {
            Some(e) => e.ns += ns,
            None => self.evidence.push(Evidence {
                category,
                basis,
                ns,
            }),
        }
    }

    pub(crate) fn apportion(
        &mut self,
        span: u64,
        weights: &[(Category, Basis, f64)],
        fallback: (Category, Basis),
    ) {
        let raw: Vec<f64> = weights.iter().map(|w| w.2).collect();
        match apportion(span, &raw) {
            Some(ns) => {
                for (w, n) in weights.iter().zip(ns) {
                    self.put(w.0, w.1, n);
                }
            }
            None => self.put(fallback.0, fallback.1, span),
        }
    }
}
