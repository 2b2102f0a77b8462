//! A budget key that owns its bytes: for leases, reservations and settlements held past the
//! request's borrow.

use super::{Ask, BudgetKey, KeyKind, Limit};

/// An [`Ask`] with its key's bytes owned.
#[derive(Debug, Clone)]
pub(crate) struct OwnedKey {
    pub limit: Limit,
    pub budget: String,
    pub kind: KeyKind,
    pub value: Vec<u8>,
}

impl OwnedKey {
    pub fn of(ask: &Ask<'_>) -> OwnedKey {
        OwnedKey {
            limit: *ask.limit,
            budget: ask.key.budget.to_string(),
            kind: ask.key.kind,
            value: ask.key.value.to_vec(),
        }
    }
}

/// `keys` as asks again, borrowing their bytes.
pub(crate) fn borrowed(keys: &[OwnedKey]) -> Vec<Ask<'_>> {
    keys.iter()
        .map(|k| Ask {
            limit: &k.limit,
            key: BudgetKey {
                budget: &k.budget,
                kind: k.kind,
                value: &k.value,
            },
        })
        .collect()
}
