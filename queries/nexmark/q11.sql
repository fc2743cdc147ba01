-- Nexmark q11: user sessions. Bids per bidder per session (a session ends after 10 seconds
-- without a bid).
-- weir: final: s['end'] <= :watermark
SELECT bidder, count(*) AS bid_count, session_window(date_time, '10 seconds') AS s
FROM STREAM bid WATERMARK date_time DELAY OF INTERVAL 4 SECONDS
GROUP BY bidder, session_window(date_time, '10 seconds');
