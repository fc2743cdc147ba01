-- Nexmark q11 as batch SQL: a bidder's session ends when more than 10 seconds pass without a
-- bid (a bid exactly 10 seconds after the last one touches the session and extends it, as the
-- streaming session window merges sessions that touch).
SELECT bidder, count(*) AS bid_count,
       named_struct('start', min(date_time), 'end', max(date_time) + INTERVAL '10 seconds') AS s
FROM (
    SELECT bidder, date_time,
           sum(opens) OVER (PARTITION BY bidder ORDER BY date_time ROWS UNBOUNDED PRECEDING) AS session
    FROM (
        SELECT bidder, date_time,
               CASE WHEN date_time - lag(date_time) OVER (PARTITION BY bidder ORDER BY date_time)
                         <= INTERVAL '10 seconds'
                    THEN 0 ELSE 1 END AS opens
        FROM bid
    ) marked
) sessions
GROUP BY bidder, session;
