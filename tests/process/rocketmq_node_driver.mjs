// Drives the real RocketMQ 5 Node.js client (npm rocketmq-client-nodejs 1.0.8, installed by
// scripts/env.sh into .cache/nodejs) against a raftlog node, for
// tests/process/test_rocketmq_nodejs.py.
//
// Input: one JSON scenario on stdin:
//   {"endpoint": "127.0.0.1:7001", "topic": "orders", "group": "billing",
//    "actions": [ACTION, ...]}
// Each action runs in turn with its own client, started and shut down around it:
//   {"do": "send", "count": N, "prefix": "m", "kind": "normal" | "fifo" | "delay" | "transaction",
//    "groups": G (fifo: message groups g0..g{G-1}, message i in group i % G),
//    "delay_ms": D (delay: deliver D ms after the send),
//    "resolutions": [R, ...] (transaction: message i ends with R[i], "commit" | "rollback" |
//      "open": never ended by the producer, left to the server's question),
//    "check_answer": "commit" | "rollback" (transaction: what the checker answers),
//    "hold_ms": H (transaction: keep the producer running until every open transaction was
//      put to its checker and answered, at most H ms)}
//     Message i has body PREFIX-i, tag even/odd, key key-i and the user property index=i.
//   {"do": "receive", "expect": N, "invisible_ms": I, "leave_unacked": K,
//    "change_invisible_ms": C, "timeout_ms": T, "await_ms": A, "never_ack": false}
//     A SimpleConsumer of the group receives (batches of up to 16, invisible for I ms, long polls
//     of A ms) until N distinct messages are acked or T ms have passed. The first K messages
//     are left unacked once (their redelivery is acked), the first of them after a
//     ChangeInvisibleDuration to C ms when C > 0. With never_ack, nothing is acked and the
//     receives go on for the T ms.
// Output: one JSON object a line, each with an "event": "sent" / "send_failed" per message
// (with "due_ms", its delivery time in unix ms, for a delayed one), "checked" per question of
// the server about an open transaction and "check_answered" once the checker's answer was
// sent, "received" per message delivered (with its "at", a monotonic time in seconds, and
// "wall_ms", the unix time in ms), "acked", "left", "changed", "receive_failed" per failed
// receive, and "done" last (exit status 0), or "fatal" (exit status 1).

import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import { format } from 'node:util';

const here = path.dirname(fileURLToPath(import.meta.url));
const installDir = process.env.RAFTLOG_NODEJS_DIR ?? path.join(here, '..', '..', '.cache', 'nodejs');
const require = createRequire(path.join(installDir, 'package.json'));
const rocketmq = require('rocketmq-client-nodejs');
// TransactionResolution is the generated enum, not re-exported by the package's index.
const { TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

const REQUEST_TIMEOUT_MS = 5000;
const BATCH_MAX = 16;
const RETRY_PAUSE_MS = 200;
const HOLD_POLL_MS = 100;

function emit(event, fields = {}) {
  process.stdout.write(`${JSON.stringify({ event, ...fields })}\n`);
}

function describe(err) {
  return { error: `${err?.constructor?.name ?? 'Error'}: ${err?.message ?? err}`, code: err?.code ?? null };
}

// The client logs through this: errors to stderr (the test shows them when it fails), the rest
// dropped (its default logger writes files under ~/logs).
const logger = {
  info() {},
  warn() {},
  debug() {},
  error(...args) { process.stderr.write(`${format(...args)}\n`); },
};

function seconds() {
  return Number(process.hrtime.bigint()) / 1e9;
}

function pause(ms) {
  return new Promise(resolve => setTimeout(resolve, ms));
}

function messageFor(scenario, action, i) {
  const message = {
    topic: scenario.topic,
    body: Buffer.from(`${action.prefix}-${i}`),
    tag: i % 2 === 0 ? 'even' : 'odd',
    keys: [ `key-${i}` ],
    properties: new Map([ [ 'index', String(i) ] ]),
  };
  if (action.kind === 'fifo') {
    message.messageGroup = `g${i % (action.groups ?? 1)}`;
  } else if (action.kind === 'delay') {
    message.deliveryTimestamp = new Date(Date.now() + action.delay_ms);
  }
  return message;
}

async function send(scenario, action) {
  const answer = action.check_answer === 'rollback' ?
    TransactionResolution.ROLLBACK : TransactionResolution.COMMIT;
  const producer = new rocketmq.Producer({
    endpoints: scenario.endpoint, namespace: '', topic: scenario.topic, logger,
    requestTimeout: REQUEST_TIMEOUT_MS,
    checker: {
      async check(view) {
        emit('checked', { message_id: view.messageId, body: view.body.toString() });
        return answer;
      },
    },
  });
  // The client sends the checker's answer (EndTransaction) after check() returns: counted here.
  let answered = 0;
  const recover = producer.onRecoverOrphanedTransactionCommand.bind(producer);
  producer.onRecoverOrphanedTransactionCommand = async (endpoints, command) => {
    await recover(endpoints, command);
    answered++;
    emit('check_answered', { message_id: command.getMessage()?.getSystemProperties()?.getMessageId() ?? null });
  };
  await producer.startup();
  let open = 0;
  try {
    for (let i = 0; i < action.count; i++) {
      const message = messageFor(scenario, action, i);
      const fields = { kind: action.kind, body: message.body.toString(), group: message.messageGroup ?? null,
        due_ms: message.deliveryTimestamp?.getTime() ?? null };
      try {
        let receipt;
        if (action.kind === 'transaction') {
          const resolution = (action.resolutions ?? [])[i] ?? 'commit';
          const transaction = producer.beginTransaction();
          receipt = await producer.send(message, transaction);
          if (resolution === 'open') {
            open++;
          } else {
            await (resolution === 'rollback' ? transaction.rollback() : transaction.commit());
          }
          fields.resolution = resolution;
        } else {
          receipt = await producer.send(message);
        }
        emit('sent', { ...fields, message_id: receipt.messageId, queue: receipt.messageQueue?.queueId ?? null,
          offset: receipt.offset ?? null });
      } catch (err) {
        emit('send_failed', { ...fields, ...describe(err) });
      }
    }
    const holdUntil = seconds() + (action.hold_ms ?? 0) / 1000;
    while (answered < open && seconds() < holdUntil) {
      await pause(HOLD_POLL_MS);
    }
  } finally {
    await producer.shutdown();
  }
}

async function receive(scenario, action) {
  const consumer = new rocketmq.SimpleConsumer({
    endpoints: scenario.endpoint, namespace: '', consumerGroup: scenario.group, logger,
    requestTimeout: REQUEST_TIMEOUT_MS, awaitDuration: action.await_ms ?? 2000,
    subscriptions: new Map([ [ scenario.topic, '*' ] ]),
  });
  await consumer.startup();
  const acked = new Set();
  const left = new Set();
  let changed = false;
  const deadline = seconds() + action.timeout_ms / 1000;
  try {
    while ((action.never_ack || acked.size < action.expect) && seconds() < deadline) {
      let messages;
      try {
        messages = await consumer.receive(BATCH_MAX, action.invisible_ms);
      } catch (err) { // a queue whose node is gone: the next receive picks another queue
        emit('receive_failed', describe(err));
        await pause(RETRY_PAUSE_MS);
        continue;
      }
      for (const message of messages) {
        emit('received', {
          message_id: message.messageId, body: message.body.toString(), tag: message.tag ?? null,
          keys: [ ...message.keys ].sort(), properties: Object.fromEntries(message.properties),
          attempt: message.deliveryAttempt ?? null, group: message.messageGroup || null,
          offset: message.offset ?? null, at: seconds(), wall_ms: Date.now(),
        });
        if (acked.has(message.messageId) || action.never_ack) {
          continue;
        }
        if (left.size < (action.leave_unacked ?? 0) && !left.has(message.messageId)) {
          left.add(message.messageId);
          emit('left', { message_id: message.messageId });
          if (!changed && (action.change_invisible_ms ?? 0) > 0) {
            await consumer.changeInvisibleDuration(message, action.change_invisible_ms);
            changed = true;
            emit('changed', { message_id: message.messageId, invisible_ms: action.change_invisible_ms });
          }
          continue;
        }
        await consumer.ack(message);
        acked.add(message.messageId);
        emit('acked', { message_id: message.messageId });
      }
    }
  } finally {
    await consumer.shutdown();
  }
}

async function main() {
  const chunks = [];
  for await (const chunk of process.stdin) {
    chunks.push(chunk);
  }
  const scenario = JSON.parse(Buffer.concat(chunks).toString());
  const actions = { send, receive };
  for (const action of scenario.actions) {
    const run = actions[action.do];
    if (!run) {
      throw new Error(`unknown action ${JSON.stringify(action.do)}`);
    }
    await run(scenario, action);
  }
  emit('done');
}

main().then(
  () => process.exit(0), // the client's gRPC channels may hold the loop open a while longer
  err => {
    emit('fatal', describe(err));
    process.stderr.write(`${err?.stack ?? err}\n`);
    process.exit(1);
  },
);
