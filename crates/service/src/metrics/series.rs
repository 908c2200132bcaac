//! A gauge family whose series are replaced as a whole.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

/// A gauge family whose series are replaced as a whole, from each snapshot, without a moment
/// in which they are gone: [`GaugeSeries::replace`] sets every current series first, then
/// removes only the series that disappeared. (Clearing the family and filling it again would
/// let a scrape in between miss series that exist before and after.)
pub struct GaugeSeries<L> {
    family: Family<L, Gauge>,
    /// The label sets the last update set (the family does not list its series).
    present: Mutex<HashSet<L>>,
}

impl<L> Default for GaugeSeries<L>
where
    L: Clone + Hash + Eq + EncodeLabelSet + Debug + Send + Sync + 'static,
{
    fn default() -> Self {
        Self {
            family: Family::default(),
            present: Mutex::new(HashSet::new()),
        }
    }
}

impl<L> GaugeSeries<L>
where
    L: Clone + Hash + Eq + EncodeLabelSet + Debug + Send + Sync + 'static,
{
    /// The family, for registration (it shares the series).
    pub fn family(&self) -> Family<L, Gauge> {
        self.family.clone()
    }

    /// Makes `values` the family's series: sets each, then removes the series of the previous
    /// update that `values` does not have. Updates run one at a time.
    pub fn replace(&self, values: HashMap<L, i64>) {
        let mut present = self.present.lock().unwrap_or_else(PoisonError::into_inner);
        for (labels, value) in &values {
            self.family.get_or_create(labels).set(*value);
        }
        for gone in present.iter().filter(|l| !values.contains_key(*l)) {
            self.family.remove(gone);
        }
        *present = values.into_keys().collect();
    }
}

/// A count as a gauge value (counts beyond `i64::MAX` do not occur; they would read as the
/// maximum).
pub fn saturating_i64(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
