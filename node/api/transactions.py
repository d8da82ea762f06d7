"""The raftlog.v1 Transactions service: each call handed to the transaction operations
(node/ops/transactions.py; docs/transactions.md)."""

from __future__ import annotations

from typing import Any

import grpc

from raftlog.node.ops.transactions import TransactionOps
from raftlog.node.transport import rpc
from raftlog.node.transport.calls import Call
from raftlog.v1 import transactions_pb2, transactions_pb2_grpc

Context = grpc.aio.ServicerContext[Any, Any]


class TransactionsService(transactions_pb2_grpc.TransactionsServicer):
    def __init__(self, ops: TransactionOps) -> None:
        self._ops = ops

    @rpc.unary
    async def Prepare(self, request: transactions_pb2.PrepareRequest,
                      context: Context) -> transactions_pb2.PrepareResponse:
        return await self._ops.prepare(request, Call.from_grpc(context))

    @rpc.unary
    async def Commit(self, request: transactions_pb2.CommitRequest,
                     context: Context) -> transactions_pb2.CommitResponse:
        return await self._ops.commit(request.txn_id, Call.from_grpc(context))

    @rpc.unary
    async def Rollback(self, request: transactions_pb2.RollbackRequest,
                       context: Context) -> transactions_pb2.RollbackResponse:
        return await self._ops.rollback(request.txn_id, Call.from_grpc(context))

    @rpc.unary
    async def ListTransactions(self, request: transactions_pb2.ListTransactionsRequest,
                               context: Context) -> transactions_pb2.ListTransactionsResponse:
        return await self._ops.list_transactions(request, Call.from_grpc(context))
