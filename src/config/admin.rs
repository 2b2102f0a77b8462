//! What operators and clients reach besides the routes: `admin.token_file` (the write
//! endpoints' bearer token) and `usage_path` (a client's own budgets).

use std::path::Path;
use std::sync::Arc;

use super::Validator;
use super::file::AdminFile;

impl Validator {
    /// `admin.token_file`, read (relative to the config's folder): the token, its surrounding
    /// whitespace trimmed. An empty or unreadable file is a problem.
    pub(super) fn admin_token(
        &mut self,
        admin: Option<AdminFile>,
        base_dir: Option<&Path>,
    ) -> Option<Arc<str>> {
        let path = admin?.token_file?;
        let path = match base_dir {
            Some(base) if Path::new(&path).is_relative() => base.join(&path),
            _ => std::path::PathBuf::from(&path),
        };
        match crate::files::read_text(&path) {
            Ok(text) if !text.trim().is_empty() => Some(Arc::from(text.trim())),
            Ok(_) => {
                self.problem("admin.token_file", format!("{} is empty", path.display()));
                None
            }
            Err(e) => {
                self.problem("admin.token_file", e);
                None
            }
        }
    }

    /// `usage_path`: a path (`/` first, no query, fragment or space).
    pub(super) fn usage_path(&mut self, path: Option<String>) -> Option<String> {
        path.filter(|path| {
            let ok = path.starts_with('/') && !path.contains(['?', '#', ' ']);
            if !ok {
                self.problem(
                    "usage_path",
                    format!("{path:?} is not a path (like /rate_limit)"),
                );
            }
            ok
        })
    }
}
