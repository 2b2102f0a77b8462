//! A config's problems, each naming its field (`routes[1].limits[0].refill_rate`), so that one
//! run of `floodgate check` names them all.

use std::fmt;

/// Every problem found in a config file, each naming its field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub problems: Vec<FieldProblem>,
}

/// One problem: the field's path (`routes[1].limits[0].refill_rate`) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldProblem {
    pub path: String,
    pub message: String,
}

impl fmt::Display for FieldProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    pub(super) fn one(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            problems: vec![FieldProblem {
                path: path.into(),
                message: message.into(),
            }],
        }
    }
}
