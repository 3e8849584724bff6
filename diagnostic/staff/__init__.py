"""The staff dashboard: consultants run the lab day from here (jobs live, lab health,
stage logs, review, approval and sending of reports, money-back decisions)."""
