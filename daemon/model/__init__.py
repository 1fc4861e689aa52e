"""The typed model every layer above shares: requests, claims, the configuration, the deployment file, errors."""
