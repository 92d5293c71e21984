"""Upgrades without guessing (issue 18; the schema-migration article): one change of a
record's shape, ``operation.provider_ref``, shipped as expand / migrate / contract
(``changes``, ``provider_ref``); resumable backfills (``backfill``); records whose two
representations disagree become StateConflicts that stop automation on their run until a
person decides (``conflicts``); what each worker build reads (``fleet``); backups that
carry their manifest, and the check of a restored database (``restore``)."""
