"""The Kubernetes layer: one client (`client`), every name Folio uses in a cluster (`names`), merge patches."""
