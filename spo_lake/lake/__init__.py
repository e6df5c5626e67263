"""The versioned trajectory lake."""
from spo_lake.lake.contracts import Contract, ContractError, contract, table_names
from spo_lake.lake.core import Lake, LakeError, Snapshot, Staged, Work

__all__ = ["Contract", "ContractError", "Lake", "LakeError", "Snapshot", "Staged", "Work", "contract", "table_names"]
