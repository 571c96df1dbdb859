//! Money as Keel handles it: currency codes, bounded amounts, checked sums.
//!
//! Owns [`Currency`] (an ISO 4217 code as Keel keeps it: three ASCII letters, upper case),
//! [`check_amount`] (an amount is a positive number of minor units no larger than
//! [`AMOUNT_MINOR_MAX`]) and [`checked_sum`]. Amounts stay `i64` minor units in events (the
//! stored format); every sum, difference and comparison of them goes through checked
//! arithmetic, so an overflow is a refusal, never a wrap.
//!
//! # Case
//!
//! A currency code is case-insensitive on the wire (`eur` is what Stripe answers) and upper
//! case inside Keel: [`Currency::parse`] upper-cases what a caller or a provider sends, and
//! the ledger compares codes byte for byte, so only a parsed code may reach it.

use crate::limits::AMOUNT_MINOR_MAX;
use std::fmt;

/// Why an amount or a currency was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MoneyError {
    /// Zero or negative.
    #[error("{0} is not a positive number of minor units")]
    NotPositive(i64),
    /// Above [`AMOUNT_MINOR_MAX`].
    #[error("{0} minor units is above the maximum of {AMOUNT_MINOR_MAX}")]
    AboveMaximum(i64),
    /// Not three ASCII letters.
    #[error("{0:?} is not an ISO 4217 currency code (three letters)")]
    Currency(String),
}

/// An ISO 4217 currency code, upper case. Built only by [`Currency::parse`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Currency(String);

impl Currency {
    /// Reads a code as it arrives on the wire: three ASCII letters in any case.
    ///
    /// ```
    /// use engine::money::Currency;
    /// assert_eq!(Currency::parse("eur").map(|c| c.as_str().to_owned()), Ok("EUR".to_owned()));
    /// assert!(Currency::parse("EURO").is_err());
    /// assert!(Currency::parse("ЕUR").is_err()); // a Cyrillic Е
    /// ```
    pub fn parse(text: &str) -> Result<Self, MoneyError> {
        if text.len() == 3 && text.bytes().all(|b| b.is_ascii_alphabetic()) {
            Ok(Self(text.to_ascii_uppercase()))
        } else {
            Err(MoneyError::Currency(text.to_owned()))
        }
    }

    /// Whether `text` is already a code as Keel keeps it (what the ledger accepts).
    pub fn is_canonical(text: &str) -> bool {
        Self::parse(text).is_ok_and(|code| code.0 == text)
    }

    /// The upper-case code.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The upper-case code, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for Currency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Checks that an amount of one charge or refund is positive and at most
/// [`AMOUNT_MINOR_MAX`].
pub fn check_amount(amount_minor: i64) -> Result<i64, MoneyError> {
    if amount_minor <= 0 {
        Err(MoneyError::NotPositive(amount_minor))
    } else if amount_minor > AMOUNT_MINOR_MAX {
        Err(MoneyError::AboveMaximum(amount_minor))
    } else {
        Ok(amount_minor)
    }
}

/// The sum of `amounts`, or `None` when it does not fit in `i64`.
pub fn checked_sum(amounts: impl IntoIterator<Item = i64>) -> Option<i64> {
    amounts.into_iter().try_fold(0_i64, i64::checked_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amounts_are_bounded_on_both_sides() {
        assert_eq!(check_amount(1), Ok(1));
        assert_eq!(check_amount(AMOUNT_MINOR_MAX), Ok(AMOUNT_MINOR_MAX));
        assert_eq!(check_amount(0), Err(MoneyError::NotPositive(0)));
        assert_eq!(check_amount(AMOUNT_MINOR_MAX + 1), Err(MoneyError::AboveMaximum(AMOUNT_MINOR_MAX + 1)));
        assert_eq!(check_amount(i64::MIN), Err(MoneyError::NotPositive(i64::MIN)));
    }

    #[test]
    fn sums_refuse_to_wrap() {
        assert_eq!(checked_sum([100, 1]), Some(101));
        assert_eq!(checked_sum([100, 1, i64::MAX]), None);
        assert_eq!(checked_sum([]), Some(0));
    }

    #[test]
    fn codes_are_upper_case_ascii_letters() {
        assert!(Currency::is_canonical("XOF"));
        assert!(!Currency::is_canonical("xof"));
        for bad in ["", "EU", "E1R", "EUR ", "€UR", "eurо"] {
            assert!(Currency::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_code_read_in_any_case_is_kept_and_shown_upper_case() {
        let code = Currency::parse("uSd").expect("three letters");
        assert_eq!((code.as_str(), code.to_string()), ("USD", "USD".to_owned()));
        assert_eq!(code.into_string(), "USD");
    }
}
