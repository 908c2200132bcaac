//! `ClientToken`: a write repeated with the same token and parameters answers the first
//! call's answer; with other parameters it is refused.

use serde_json::Value;

use super::account::Account;
use super::errors::ApiError;
use super::params::Params;
use super::types::{Effects, Outcome};

impl Account {
    /// The earlier answer to a write with this `ClientToken`, or
    /// `IdempotentParameterMismatch` when that write had other parameters.
    fn replay(&self, action: &str, params: &Params) -> Result<Option<Value>, ApiError> {
        let Some(token) = params.get("ClientToken") else {
            return Ok(None);
        };
        match self.tokens.get(&format!("{action}|{token}")) {
            None => Ok(None),
            Some((first, answer)) if *first == own_params(params) => Ok(Some(answer.clone())),
            Some(_) => Err(ApiError::new(
                400,
                "IdempotentParameterMismatch",
                "The specified parameter ClientToken has been used by a request with different parameters.",
            )),
        }
    }

    fn remember(&mut self, action: &str, params: &Params, answer: &Value) {
        if let Some(token) = params.get("ClientToken") {
            self.tokens.insert(
                format!("{action}|{token}"),
                (own_params(params), answer.clone()),
            );
        }
    }

    pub(super) fn idempotent(
        &mut self,
        action: &str,
        params: &Params,
        run: fn(&mut Self, &Params) -> Outcome,
    ) -> Outcome {
        if let Some(answer) = self.replay(action, params)? {
            return Ok((answer, Effects::default()));
        }
        let (answer, effects) = run(self, params)?;
        self.remember(action, params, &answer);
        Ok((answer, effects))
    }
}

/// The parameters of an action without the common ones that change on every attempt
/// (signature, nonce, time, credentials): what a reused `ClientToken` is compared on.
fn own_params(params: &Params) -> Params {
    const COMMON: [&str; 11] = [
        "Signature",
        "SignatureNonce",
        "SignatureMethod",
        "SignatureVersion",
        "SignatureType",
        "Timestamp",
        "AccessKeyId",
        "SecurityToken",
        "Format",
        "Version",
        "RegionId",
    ];
    params
        .iter()
        .filter(|(k, _)| !COMMON.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}
