"""Customer accounts: invitations into an organisation, setting a password, and the
lockout page shown after too many failed logins."""
