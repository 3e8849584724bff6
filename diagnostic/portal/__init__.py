"""The customer portal: book a lab day, submit the configuration, follow the job and
download the approved report, always within the customer's own organisation."""
